// The resized-crop kernels: the box draw and the resample (resized_crop.h). Their arithmetic is
// resized_crop_math.h's, shared with the C++ reference.
#include <cmath>

#include "resized_crop_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

__global__ void crop_draw_kernel(CropDrawLaunch d) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= d.batch) return;
  uint64_t seed, offset;
  d.rng.unpack(seed, offset);
  crop_math::draw_box(d.spec, static_cast<int>(d.sizes[b * 3]),
                      static_cast<int>(d.sizes[b * 3 + 1]), seed, offset, static_cast<uint64_t>(b),
                      d.boxes + b * crop_math::kBoxFields);
}

// blockIdx.z: the sample; a 32 x 8 tile of output pixels per block, each thread all channels
// (the axis windows once per pixel, each tap's weights once for all channels).
__global__ void resized_crop_kernel(CropLaunch a) {
  namespace cm = crop_math;
  const int b = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= a.out_w || y >= a.out_h) return;
  const int32_t* box = a.boxes + b * cm::kBoxFields;
  const int h = static_cast<int>(a.sizes[b * 3]), w = static_cast<int>(a.sizes[b * 3 + 1]),
            c_in = static_cast<int>(a.sizes[b * 3 + 2]);
  const int64_t plane = static_cast<int64_t>(a.out_h) * a.out_w;
  const int64_t pixel = static_cast<int64_t>(y) * a.out_w + x;
  // Channel c of this pixel at out[c * step]: planes (B, C, H, W), or a pixel's channels side by
  // side (channels-last), so a warp writes one contiguous run.
  float* out = a.out + static_cast<int64_t>(b) * a.channels * plane +
               (a.channels_last ? pixel * a.channels : pixel);
  const int64_t step = a.channels_last ? 1 : plane;
  if (c_in != a.channels) {
    for (int c = 0; c < a.channels; ++c) out[c * step] = NAN;
    return;
  }
  const int xr = box[cm::kFlip] ? a.out_w - 1 - x : x;
  const cm::AxisWindow rows =
      cm::axis_window(box[cm::kOffsetY] + y, box[cm::kHeight], box[cm::kResizedH], box[cm::kSubY]);
  const cm::AxisWindow cols =
      cm::axis_window(box[cm::kOffsetX] + xr, box[cm::kWidth], box[cm::kResizedW], box[cm::kSubX]);
  const uint8_t* src = a.packed + a.offsets[b];
  const cm::Layout layout = cm::layout_of(a.planar, h, w, a.channels);
  float v[kCropMaxChannels];
  cm::resample_channels<kCropMaxChannels>(src, layout, a.channels, box[cm::kTop], box[cm::kLeft],
                                          rows, cols, v);
#pragma unroll
  for (int c = 0; c < kCropMaxChannels; ++c)
    if (c < a.channels) out[c * step] = cm::normalize(v[c], a.normalization[c]);
}

}  // namespace

void launch_crop_draw(const CropDrawLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  constexpr int kThreads = 128;
  crop_draw_kernel<<<(args.batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

void launch_resized_crop(const CropLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  const dim3 block(32, 8);
  const dim3 grid((args.out_w + block.x - 1) / block.x, (args.out_h + block.y - 1) / block.y,
                  args.batch);
  resized_crop_kernel<<<grid, block, 0, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem
