// The augmentation kernels: one draws every sample's parameters, one augments the whole batch.
//
// The augment kernel: a block makes a 32x32 tile of output pixels of one sample, all channels:
//   0. stage the source bytes the tile can read (a small window of the crop, a few KB) in shared
//      memory with coalesced loads, and each tile row's and column's centre offset;
//   1. sample the crop-resize-rotate composition for the tile plus a blur halo (where a pixel
//      reads is located once for all channels; reads outside the staged window, which only a
//      window too large to stage produces, go to global memory);
//   2. blur rows (the halo rows too);
//   3. blur columns, normalize, write; each thread slides down 4 consecutive rows of one column,
//      so each value it loads serves up to `taps` outputs.
// The uint8 source is read once and the float output written once, with no intermediate image
// in DRAM. The blur size and the channel count are template parameters for the common cases
// (weights in registers, loops unrolled, no division by a run-time value); other values run the
// same code with the sizes read at run time. The profile of the first version (one thread per
// output, blur size at run time, 64-bit gathers from global memory) was bound by integer
// address arithmetic, not by memory: this layout removes most of it.
#include "augment_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

constexpr int kTileW = 32;
constexpr int kTileH = 32;
constexpr int kThreads = 256;
constexpr int kWarpsPerTile = kThreads / kTileW;     // thread rows of a tile
constexpr int kRowsPerThread = kTileH / kWarpsPerTile;  // outputs per thread and channel
constexpr int kMaxRadius = 31;                          // AugmentSpec allows taps <= 63
constexpr int kMaxHalo = kTileW + 2 * kMaxRadius;
constexpr int kStageBytes = 4096;  // the SPEC's tiles read about 29x29 bytes per channel
static_assert(kTileH % kWarpsPerTile == 0, "thread rows must divide the tile height");
static_assert(kTileW == kTileH, "the halo arrays assume a square tile");

// Rows and columns of the halo'd tile map to image rows/columns through reflect padding;
// positions further out than the halo of the last (partial) tile are never read by a written
// output, so clamping them first keeps reflect() in its valid range.
__device__ __forceinline__ int halo_index(int pos, int n, int radius) {
  pos = pos < -radius ? -radius : pos;
  pos = pos > n - 1 + radius ? n - 1 + radius : pos;
  return augment_math::reflect(pos, n);
}

// The source rectangle every read of output rows [ylo, yhi] x columns [xlo, xhi] falls in,
// with a pixel of margin for rounding; rows == 0 when it is too large to stage (or empty).
// Only speed depends on it: a read outside it goes to global memory.
struct Window {
  int row0, col0, rows, cols;
};

__device__ Window source_window(const augment_math::Geometry& g,
                                const augment_math::SampleParams& p, int ylo, int yhi, int xlo,
                                int xhi, int channels) {
  namespace am = augment_math;
  float cmin = 3e38f, cmax = -3e38f, rmin = 3e38f, rmax = -3e38f;
  for (int k = 0; k < 4; ++k) {  // the extremes of an affine map are at the corners
    float u = am::centre_offset((k & 2) ? xhi : xlo, g.out_w);
    const float v = am::centre_offset((k & 1) ? yhi : ylo, g.out_h);
    if (p.flip) u = -u;
    const float fc = p.cos_a * u - p.sin_a * v + 0.5f * g.out_w;  // locate's fc, give or take
    const float fr = p.sin_a * u + p.cos_a * v + 0.5f * g.out_h;  // an ulp: the margin covers it
    cmin = fminf(cmin, fc);
    cmax = fmaxf(cmax, fc);
    rmin = fminf(rmin, fr);
    rmax = fmaxf(rmax, fr);
  }
  const Window none{0, 0, 0, 0};
  if (cmax < -1.0f || rmax < -1.0f || cmin > g.out_w + 1.0f || rmin > g.out_h + 1.0f) return none;
  const int ci_lo = max(0, static_cast<int>(floorf(cmin)) - 1);
  const int ci_hi = min(g.out_w - 1, static_cast<int>(floorf(cmax)) + 1);
  const int ri_lo = max(0, static_cast<int>(floorf(rmin)) - 1);
  const int ri_hi = min(g.out_h - 1, static_cast<int>(floorf(rmax)) + 1);
  if (ci_lo > ci_hi || ri_lo > ri_hi) return none;
  auto source = [](int i, float scale) {  // locate's source index for resized pixel i
    return static_cast<int>(fmaxf((static_cast<float>(i) + 0.5f) * scale - 0.5f, 0.0f));
  };
  const int col0 = max(0, p.left + source(ci_lo, g.scale_x) - 1);
  const int col1 = min(g.in_w - 1, p.left + source(ci_hi, g.scale_x) + 2);
  const int row0 = max(0, p.top + source(ri_lo, g.scale_y) - 1);
  const int row1 = min(g.in_h - 1, p.top + source(ri_hi, g.scale_y) + 2);
  const Window w{row0, col0, row1 - row0 + 1, col1 - col0 + 1};
  if (w.rows <= 0 || w.cols <= 0 || w.rows * w.cols * channels > kStageBytes) return none;
  return w;
}

template <int kTaps, int kChannels>  // 0: known only at run time (a.taps, a.channels)
__global__ void __launch_bounds__(kThreads) augment_kernel(AugmentLaunch a) {
  namespace am = augment_math;
  extern __shared__ float smem[];
  __shared__ float u_of_column[kMaxHalo], v_of_row[kMaxHalo];
  __shared__ __align__(4) uint8_t staged[kStageBytes];
  __shared__ Window window;
  const int taps = kTaps > 0 ? kTaps : a.taps;
  const int C = kChannels > 0 ? kChannels : a.channels;
  const int radius = taps / 2;
  const int halo_w = kTileW + 2 * radius, halo_h = kTileH + 2 * radius;
  float* sampled = smem;                          // [C][halo_h][halo_w]
  float* rows = sampled + C * halo_h * halo_w;    // [C][halo_h][kTileW]
  float* weights = rows + C * halo_h * kTileW;    // [taps]

  const int b = blockIdx.z;
  const int x0 = blockIdx.x * kTileW, y0 = blockIdx.y * kTileH;
  const int tid = threadIdx.x, tx = tid % kTileW, ty = tid / kTileW;
  const am::Geometry g = a.geometry;
  const am::SampleParams p{a.top[b], a.left[b], a.cos_a[b], a.sin_a[b], a.flip[b]};
  const int in_plane = g.in_h * g.in_w;
  const uint8_t* image = a.images + static_cast<int64_t>(b) * C * in_plane;

  // 0. Per tile: weights, the centre offsets of the halo's rows and columns, the window.
  if (tid < taps) weights[tid] = a.weights[static_cast<int64_t>(b) * taps + tid];
  if (tid >= 64 && tid - 64 < halo_w)
    u_of_column[tid - 64] = am::centre_offset(halo_index(x0 + tid - 64 - radius, g.out_w, radius), g.out_w);
  if (tid >= 160 && tid - 160 < halo_h)
    v_of_row[tid - 160] = am::centre_offset(halo_index(y0 + tid - 160 - radius, g.out_h, radius), g.out_h);
  if (tid == 0)
    window = source_window(g, p, max(0, y0 - radius), min(g.out_h - 1, y0 + kTileH - 1 + radius),
                           max(0, x0 - radius), min(g.out_w - 1, x0 + kTileW - 1 + radius), C);
  __syncthreads();
  const Window win = window;
  const int win_plane = win.rows * win.cols;
  for (int c = 0; c < C; ++c)  // a warp per row: coalesced byte loads
    for (int r = ty; r < win.rows; r += kWarpsPerTile)
      for (int col = tx; col < win.cols; col += kTileW)
        staged[c * win_plane + r * win.cols + col] =
            image[c * in_plane + (win.row0 + r) * g.in_w + win.col0 + col];
  __syncthreads();

  // 1. Sample the tile and its halo.
  const int halo = halo_h * halo_w;
  for (int idx = tid; idx < halo; idx += kThreads) {
    const int ly = idx / halo_w, lx = idx - ly * halo_w;
    const am::Tap t = am::locate_centred(g, p, u_of_column[lx], v_of_row[ly]);
    if (!t.inside) {
      for (int c = 0; c < C; ++c) sampled[c * halo + idx] = 0.0f;
    } else if (t.row0 >= win.row0 && t.row1 < win.row0 + win.rows && t.x0 >= win.col0 &&
               t.x1 < win.col0 + win.cols) {
      const int o00 = (t.row0 - win.row0) * win.cols + (t.x0 - win.col0);
      const int dx = t.x1 - t.x0, dy = (t.row1 - t.row0) * win.cols;
      for (int c = 0; c < C; ++c) {
        const uint8_t* s = staged + c * win_plane + o00;
        sampled[c * halo + idx] =
            am::bilerp(am::byte_to_float(s[0]), am::byte_to_float(s[dx]),
                       am::byte_to_float(s[dy]), am::byte_to_float(s[dy + dx]), t.lx, t.ly);
      }
    } else {
      for (int c = 0; c < C; ++c) sampled[c * halo + idx] = am::read(image + c * in_plane, g.in_w, t);
    }
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
      float window_values[kRowsPerThread + kTaps - 1];
#pragma unroll
      for (int j = 0; j < kRowsPerThread + kTaps - 1; ++j) window_values[j] = col[j * kTileW];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float v = am::blur_taps(w, kTaps, [&](int k) { return window_values[r + k]; });
        if (y_first + r < g.out_h) dst[r * g.out_w] = am::normalize(v, mean, inv_std);
      }
    } else {
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float v = am::blur_taps(weights, taps, [&](int k) { return col[(r + k) * kTileW]; });
        if (y_first + r < g.out_h) dst[r * g.out_w] = am::normalize(v, mean, inv_std);
      }
    }
  }
}

template <int kTaps, int kChannels>
void launch_augment_for(const AugmentLaunch& args, cudaStream_t stream) {
  const int radius = args.taps / 2;
  const size_t smem = sizeof(float) * (args.channels * ((kTileH + 2 * radius) * (kTileW + 2 * radius) +
                                                        (kTileH + 2 * radius) * kTileW) +
                                       args.taps);
  const dim3 grid((args.geometry.out_w + kTileW - 1) / kTileW,
                  (args.geometry.out_h + kTileH - 1) / kTileH, args.batch);
  if (smem > 32 * 1024)  // 48 KB less the static arrays: above that, opt in
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(augment_kernel<kTaps, kChannels>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  augment_kernel<kTaps, kChannels><<<grid, kThreads, smem, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

template <int kChannels>
void launch_augment_channels(const AugmentLaunch& args, cudaStream_t stream) {
  switch (args.taps) {
    case 1: return launch_augment_for<1, kChannels>(args, stream);
    case 3: return launch_augment_for<3, kChannels>(args, stream);
    case 5: return launch_augment_for<5, kChannels>(args, stream);
    case 7: return launch_augment_for<7, kChannels>(args, stream);
    case 9: return launch_augment_for<9, kChannels>(args, stream);
    default: return launch_augment_for<0, kChannels>(args, stream);
  }
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
  if (args.channels == 3) return launch_augment_channels<3>(args, stream);
  launch_augment_channels<0>(args, stream);
}

void launch_draw(const DrawLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  constexpr int kDrawThreads = 128;
  draw_kernel<<<(args.batch + kDrawThreads - 1) / kDrawThreads, kDrawThreads, 0, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem
