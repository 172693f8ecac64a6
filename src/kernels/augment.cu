// The fused augmentation kernel: per block, a tile of output pixels of one sample, all channels:
// it samples the crop-resize-rotate composition for the tile plus a blur halo into shared
// memory, blurs rows, then columns, normalizes and writes. The uint8 source is read once
// (through the cache) and the float output written once: no intermediate image in DRAM.
#include "augment_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

constexpr int kTileW = 32;
constexpr int kTileH = 16;
constexpr int kThreads = 256;

// Rows and columns of the halo'd tile map to image rows/columns through reflect padding;
// positions further out than the halo of the last (partial) tile are never read by a written
// output, so clamping them first keeps reflect() in its valid range.
__device__ __forceinline__ int halo_index(int pos, int n, int radius) {
  pos = pos < -radius ? -radius : pos;
  pos = pos > n - 1 + radius ? n - 1 + radius : pos;
  return augment_math::reflect(pos, n);
}

__global__ void __launch_bounds__(kThreads) augment_kernel(AugmentLaunch a) {
  namespace am = augment_math;
  extern __shared__ float smem[];
  const int radius = a.taps / 2;
  const int halo_w = kTileW + 2 * radius, halo_h = kTileH + 2 * radius;
  const int C = a.channels;
  float* rot = smem;                            // [C][halo_h][halo_w]
  float* rows = smem + C * halo_h * halo_w;     // [C][halo_h][kTileW]

  const int b = blockIdx.z;
  const int x0 = blockIdx.x * kTileW, y0 = blockIdx.y * kTileH;
  const am::Geometry g = a.geometry;
  const am::SampleParams p{a.top[b], a.left[b], a.cos_a[b], a.sin_a[b], a.flip[b]};
  const float* w = a.weights + static_cast<int64_t>(b) * a.taps;
  const int64_t in_plane = static_cast<int64_t>(g.in_h) * g.in_w;
  const int64_t out_plane = static_cast<int64_t>(g.out_h) * g.out_w;
  const uint8_t* image = a.images + static_cast<int64_t>(b) * C * in_plane;

  // 1. Sample the tile and its halo: where each pixel reads is computed once for all channels.
  for (int idx = threadIdx.x; idx < halo_h * halo_w; idx += blockDim.x) {
    const int ly = idx / halo_w, lx = idx % halo_w;
    const am::Tap tap = am::locate(g, p, halo_index(y0 + ly - radius, g.out_h, radius),
                                   halo_index(x0 + lx - radius, g.out_w, radius));
    for (int c = 0; c < C; ++c) rot[c * halo_h * halo_w + idx] = am::read(image + c * in_plane, tap);
  }
  __syncthreads();
  // 2. Blur along rows (the halo rows too: step 3 needs them).
  for (int idx = threadIdx.x; idx < C * halo_h * kTileW; idx += blockDim.x) {
    const int c = idx / (halo_h * kTileW), rem = idx % (halo_h * kTileW);
    const int ly = rem / kTileW, x = rem % kTileW;
    const float* src = rot + c * halo_h * halo_w + ly * halo_w + x;
    rows[idx] = am::blur_taps(w, a.taps, [&](int k) { return src[k]; });
  }
  __syncthreads();
  // 3. Blur along columns, normalize, write: consecutive threads write consecutive columns.
  for (int idx = threadIdx.x; idx < C * kTileH * kTileW; idx += blockDim.x) {
    const int c = idx / (kTileH * kTileW), rem = idx % (kTileH * kTileW);
    const int y = rem / kTileW, x = rem % kTileW;
    if (y0 + y >= g.out_h || x0 + x >= g.out_w) continue;
    const float* src = rows + c * halo_h * kTileW + y * kTileW + x;
    const float v = am::blur_taps(w, a.taps, [&](int k) { return src[k * kTileW]; });
    a.out[(static_cast<int64_t>(b) * C + c) * out_plane + static_cast<int64_t>(y0 + y) * g.out_w +
          x0 + x] = (v - a.mean[c]) / a.std[c];
  }
}

}  // namespace

void launch_augment(const AugmentLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  const int radius = args.taps / 2;
  const size_t smem = sizeof(float) * args.channels *
                      ((kTileH + 2 * radius) * (kTileW + 2 * radius) + (kTileH + 2 * radius) * kTileW);
  const dim3 grid((args.geometry.out_w + kTileW - 1) / kTileW,
                  (args.geometry.out_h + kTileH - 1) / kTileH, args.batch);
  if (smem > 48 * 1024)
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(augment_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  augment_kernel<<<grid, kThreads, smem, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem
