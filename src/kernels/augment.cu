// The augmentation kernels: one draws every sample's parameters, one augments the whole batch.
//
// The augment kernel: a block makes a 32x32 tile of output pixels of one sample, all channels:
//   1. sample the crop-resize-rotate composition for the tile plus a blur halo into shared
//      memory (where a pixel reads is located once for all channels);
//   2. blur rows (the halo rows too);
//   3. blur columns, normalize, write; each thread slides down 4 consecutive rows of one column,
//      so each value it loads serves up to `taps` outputs.
// The uint8 source is read once (through the cache) and the float output written once, with
// no intermediate image in DRAM. The blur size is a template parameter for the common sizes
// (weights in registers, loops unrolled, no integer division by a run-time value); other sizes
// run the same code with the size read at run time.
#include "augment_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

constexpr int kTileW = 32;
constexpr int kTileH = 32;
constexpr int kThreads = 256;
constexpr int kWarpsPerTile = kThreads / kTileW;     // thread rows of a tile
constexpr int kRowsPerThread = kTileH / kWarpsPerTile;  // outputs per thread and channel
static_assert(kTileH % kWarpsPerTile == 0, "thread rows must divide the tile height");

// Rows and columns of the halo'd tile map to image rows/columns through reflect padding;
// positions further out than the halo of the last (partial) tile are never read by a written
// output, so clamping them first keeps reflect() in its valid range.
__device__ __forceinline__ int halo_index(int pos, int n, int radius) {
  pos = pos < -radius ? -radius : pos;
  pos = pos > n - 1 + radius ? n - 1 + radius : pos;
  return augment_math::reflect(pos, n);
}

template <int kTaps>  // 0: the blur size is a.taps, known at run time
__global__ void __launch_bounds__(kThreads) augment_kernel(AugmentLaunch a) {
  namespace am = augment_math;
  extern __shared__ float smem[];
  const int taps = kTaps > 0 ? kTaps : a.taps;
  const int radius = taps / 2;
  const int halo_w = kTileW + 2 * radius, halo_h = kTileH + 2 * radius;
  const int C = a.channels;
  float* sampled = smem;                          // [C][halo_h][halo_w]
  float* rows = sampled + C * halo_h * halo_w;    // [C][halo_h][kTileW]
  float* weights = rows + C * halo_h * kTileW;    // [taps]

  const int b = blockIdx.z;
  const int x0 = blockIdx.x * kTileW, y0 = blockIdx.y * kTileH;
  const int tx = threadIdx.x % kTileW, ty = threadIdx.x / kTileW;
  const am::Geometry g = a.geometry;
  const am::SampleParams p{a.top[b], a.left[b], a.cos_a[b], a.sin_a[b], a.flip[b]};
  const int64_t in_plane = static_cast<int64_t>(g.in_h) * g.in_w;
  const uint8_t* image = a.images + static_cast<int64_t>(b) * C * in_plane;
  if (threadIdx.x < taps) weights[threadIdx.x] = a.weights[static_cast<int64_t>(b) * taps + threadIdx.x];

  // 1. Sample the tile and its halo.
  const int halo = halo_h * halo_w;
  for (int idx = threadIdx.x; idx < halo; idx += kThreads) {
    const int ly = idx / halo_w, lx = idx - ly * halo_w;
    const am::Tap tap = am::locate(g, p, halo_index(y0 + ly - radius, g.out_h, radius),
                                   halo_index(x0 + lx - radius, g.out_w, radius));
    for (int c = 0; c < C; ++c) sampled[c * halo + idx] = am::read(image + c * in_plane, tap);
  }
  __syncthreads();

  float w[kTaps > 0 ? kTaps : 1];  // the weights in registers when the size is known
  if constexpr (kTaps > 0) {
#pragma unroll
    for (int k = 0; k < kTaps; ++k) w[k] = weights[k];
  }

  // 2. Blur along rows: thread column tx, every kWarpsPerTile-th row (a warp reads one row).
  for (int c = 0; c < C; ++c) {
    for (int ly = ty; ly < halo_h; ly += kWarpsPerTile) {
      const float* src = sampled + c * halo + ly * halo_w + tx;
      auto at = [&](int k) { return src[k]; };
      float v;
      if constexpr (kTaps > 0)
        v = am::blur_taps(w, kTaps, at);
      else
        v = am::blur_taps(weights, taps, at);
      rows[(c * halo_h + ly) * kTileW + tx] = v;
    }
  }
  __syncthreads();

  // 3. Blur along columns, normalize, write: a warp writes 32 consecutive floats of one row.
  const int x = x0 + tx, y_first = y0 + ty * kRowsPerThread;
  if (x >= g.out_w) return;
  const int64_t out_plane = static_cast<int64_t>(g.out_h) * g.out_w;
  for (int c = 0; c < C; ++c) {
    const float* col = rows + (c * halo_h + ty * kRowsPerThread) * kTileW + tx;
    float* dst = a.out + (static_cast<int64_t>(b) * C + c) * out_plane +
                 static_cast<int64_t>(y_first) * g.out_w + x;
    const float mean = a.mean[c], inv_std = a.inv_std[c];
    if constexpr (kTaps > 0) {
      float window[kRowsPerThread + kTaps - 1];
#pragma unroll
      for (int j = 0; j < kRowsPerThread + kTaps - 1; ++j) window[j] = col[j * kTileW];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float v = am::blur_taps(w, kTaps, [&](int k) { return window[r + k]; });
        if (y_first + r < g.out_h) dst[static_cast<int64_t>(r) * g.out_w] = am::normalize(v, mean, inv_std);
      }
    } else {
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float v = am::blur_taps(weights, taps, [&](int k) { return col[(r + k) * kTileW]; });
        if (y_first + r < g.out_h) dst[static_cast<int64_t>(r) * g.out_w] = am::normalize(v, mean, inv_std);
      }
    }
  }
}

template <int kTaps>
void launch_augment_taps(const AugmentLaunch& args, cudaStream_t stream) {
  const int radius = args.taps / 2;
  const size_t smem = sizeof(float) * (args.channels * ((kTileH + 2 * radius) * (kTileW + 2 * radius) +
                                                        (kTileH + 2 * radius) * kTileW) +
                                       args.taps);
  const dim3 grid((args.geometry.out_w + kTileW - 1) / kTileW,
                  (args.geometry.out_h + kTileH - 1) / kTileH, args.batch);
  if (smem > 48 * 1024)
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(augment_kernel<kTaps>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  augment_kernel<kTaps><<<grid, kThreads, smem, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

__global__ void draw_kernel(DrawLaunch d) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= d.batch) return;
  uint64_t seed = d.rng.seed, offset = d.rng.offset;
  if (d.rng.captured) {  // as at::cuda::philox::unpack: read when the (replayed) kernel runs
    seed = static_cast<uint64_t>(*d.rng.seed_ptr);
    offset = static_cast<uint64_t>(*d.rng.offset_ptr) + d.rng.offset_intragraph;
  }
  const augment_math::Drawn s = augment_math::draw_sample(
      d.spec, seed, offset, static_cast<uint64_t>(b), d.weights + static_cast<int64_t>(b) * d.spec.taps);
  d.top[b] = s.top;
  d.left[b] = s.left;
  d.flip[b] = s.flip;
  d.angle_deg[b] = s.angle_deg;
  d.cos_a[b] = s.cos_a;
  d.sin_a[b] = s.sin_a;
  d.sigma[b] = s.sigma;
}

}  // namespace

void launch_augment(const AugmentLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  TANDEM_CHECK_ARG(args.batch <= 65535, "batch of ", args.batch,
                   " images is too large for one augment launch: expected at most 65535");
  switch (args.taps) {
    case 1: return launch_augment_taps<1>(args, stream);
    case 3: return launch_augment_taps<3>(args, stream);
    case 5: return launch_augment_taps<5>(args, stream);
    case 7: return launch_augment_taps<7>(args, stream);
    case 9: return launch_augment_taps<9>(args, stream);
    default: return launch_augment_taps<0>(args, stream);
  }
}

void launch_draw(const DrawLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  constexpr int kDrawThreads = 128;
  draw_kernel<<<(args.batch + kDrawThreads - 1) / kDrawThreads, kDrawThreads, 0, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem
