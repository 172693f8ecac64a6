// The augmentation kernels: one draws every sample's parameters, one augments the whole batch.
//
// The augment kernel: a block makes a 32x32 tile of output pixels of one sample, all channels:
//   0. per tile: the blur weights, the centre offsets of the tile's (halo'd) rows and columns,
//      the source window the tile reads, and tables of the resized rows and columns the tile's
//      rotation can land on (their source offsets in the window and bilinear weights);
//   1. stage the window (a few hundred source pixels) in shared memory with coalesced loads;
//      three channels as four halves per pixel (8 bytes; a byte is exact in a half), other
//      counts as floats;
//   2. sample the crop-resize-rotate composition for the tile plus a blur halo: rotate back to
//      a resized pixel, look its row and column up, read four staged pixels (one 8-byte load
//      each for three channels), widen their halves to floats and interpolate;
//   3. blur rows (the halo rows too), two outputs per thread from 8-byte loads;
//   4. blur columns, normalize, write; each thread slides down 4 consecutive rows of one column,
//      so each value it loads serves up to `taps` outputs.
// The uint8 source is read once and the float output written once, with no intermediate image
// in DRAM. The blur size and the channel count are template parameters for the common cases
// (weights in registers, loops unrolled); other values run the same code with the sizes read at
// run time. A tile whose window or tables do not fit (only extreme downscaling makes them that
// large) samples with the plain per-pixel arithmetic from global memory. The profiles of
// earlier versions (NOTES.md) were bound first by instruction issue (integer address work,
// integer-to-float conversions, unfused multiply-adds), then by shared-memory wavefronts (a
// window of 16-byte float pixels: four 16-byte loads per sampled pixel), then by the integer
// pipe (a window of byte pixels: a byte permute per value); halves cost half the wavefronts of
// floats and one floating-point instruction per value.
#include <cuda_fp16.h>

#include <algorithm>

#include "augment_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

namespace am = augment_math;

constexpr int kTileW = 32;
constexpr int kTileH = 32;
constexpr int kThreads = 256;
constexpr int kWarpsPerTile = kThreads / kTileW;        // thread rows of a tile
constexpr int kRowsPerThread = kTileH / kWarpsPerTile;  // column-pass outputs per thread
constexpr int kMaxRadius = 31;                          // AugmentSpec allows taps <= 63
constexpr int kMaxHalo = kTileW + 2 * kMaxRadius;
constexpr int kStageFloats = 4096;  // 16 KB of 4-byte words: the SPEC's tiles read ~29x29 pixels
constexpr int kMaxTable = 64;  // resized rows (columns) a tile can land on; SPEC: <= 60
static_assert(kTileH % kWarpsPerTile == 0, "thread rows must divide the tile height");
static_assert(kTileW == kTileH, "the halo arrays assume a square tile");

// Rows and columns of the halo'd tile map to image rows/columns through reflect padding;
// positions further out than the halo of the last (partial) tile are never read by a written
// output, so clamping them first keeps reflect() in its valid range.
__device__ __forceinline__ int halo_index(int pos, int n, int radius) {
  pos = pos < -radius ? -radius : pos;
  pos = pos > n - 1 + radius ? n - 1 + radius : pos;
  return am::reflect(pos, n);
}

// What a tile reads: the resized rows [ri0, ri0 + n_rows) and columns [ci0, ci0 + n_cols) its
// rotation can land on (from the extremes of the rotation over the tile's corners, with a pixel
// of margin for rounding), and the source rectangle those read. n_rows == n_cols == 0: too
// large to stage or tabulate (or nothing inside the image); the tile samples from global
// memory. Only speed depends on it: a pixel that lands outside the tables is sampled the plain
// way.
struct Window {
  int row0, col0, rows, cols;    // source rectangle
  int ri0, n_rows, ci0, n_cols;  // resized rows and columns
  __device__ bool staged() const { return n_cols > 0; }
};

__device__ Window tile_window(const am::Geometry& g, const am::SampleParams& p, float u_lo,
                              float u_hi, float v_lo, float v_hi, int pixel_words) {
  float cmin = 3e38f, cmax = -3e38f, rmin = 3e38f, rmax = -3e38f;
  for (int k = 0; k < 4; ++k) {  // the extremes of an affine map are at the corners
    const float u = (k & 2) ? u_hi : u_lo, v = (k & 1) ? v_hi : v_lo;
    const am::Rotated q = am::rotate_to_grid(g, p.cos_a, p.sin_a, u, v);  // rotate_back's
    cmin = fminf(cmin, q.fc);
    cmax = fmaxf(cmax, q.fc);
    rmin = fminf(rmin, q.fr);
    rmax = fmaxf(rmax, q.fr);
  }
  Window w{0, 0, 0, 0, 0, 0, 0, 0};
  const Window none = w;
  if (cmax < -1.0f || rmax < -1.0f || cmin > g.out_w + 1.0f || rmin > g.out_h + 1.0f) return w;
  w.ci0 = max(0, static_cast<int>(floorf(cmin)) - 1);
  w.ri0 = max(0, static_cast<int>(floorf(rmin)) - 1);
  const int ci_hi = min(g.out_w - 1, static_cast<int>(floorf(cmax)) + 1);
  const int ri_hi = min(g.out_h - 1, static_cast<int>(floorf(rmax)) + 1);
  w.n_cols = ci_hi - w.ci0 + 1;
  w.n_rows = ri_hi - w.ri0 + 1;
  if (w.n_cols <= 0 || w.n_rows <= 0 || w.n_cols > kMaxTable || w.n_rows > kMaxTable) return none;
  // The resize is monotonic: the first and last resized row (column) bound the source read.
  const am::AxisTap c_lo = am::axis_tap(w.ci0, g.scale_x, g.crop_w, p.left);
  const am::AxisTap c_hi = am::axis_tap(ci_hi, g.scale_x, g.crop_w, p.left);
  const am::AxisTap r_lo = am::axis_tap(w.ri0, g.scale_y, g.crop_h, p.top);
  const am::AxisTap r_hi = am::axis_tap(ri_hi, g.scale_y, g.crop_h, p.top);
  w.col0 = c_lo.i0;
  w.cols = c_hi.i1 - c_lo.i0 + 1;
  w.row0 = r_lo.i0;
  w.rows = r_hi.i1 - r_lo.i0 + 1;
  return w.rows * w.cols * pixel_words <= kStageFloats ? w : none;
}

// A tabulated resized row or column, 8 bytes (one load): where its two source rows (columns)
// start in the staged window, in Staging::offset_unit — i0 at `offset`, i1 at offset + step,
// both below kStageFloats, packed as offset | step << 16 — and the bilinear weight l of i1
// (1 - l of i0, computed as axis_tap computes it, so the rounding is the same).
struct TableEntry {
  uint32_t offset_step;
  float l;
  __device__ int offset() const { return static_cast<int>(offset_step & 0xffffu); }
  __device__ int step() const { return static_cast<int>(offset_step >> 16); }
};
static_assert(kStageFloats <= 0x10000, "table offsets are 16-bit");

__device__ __forceinline__ TableEntry table_entry(const am::AxisTap& t, int origin, int stride) {
  const int offset = (t.i0 - origin) * stride, step = (t.i1 - t.i0) * stride;
  return {static_cast<uint32_t>(offset) | (static_cast<uint32_t>(step) << 16), t.l};
}

__device__ __forceinline__ am::AxisTap weights_of(const TableEntry& e) {
  return {0, 0, e.l, 1.0f - e.l};
}

// A staged 3-channel pixel: halves (R, G) and (B, 0). A byte v becomes a half exactly as
// byte_to_float makes a float: 1024 + v assembled as a half's bit pattern (0x6400 | v), minus
// 1024 — two values per subtraction.
__device__ __forceinline__ uint2 staged_pixel(uint8_t r, uint8_t g, uint8_t b) {
  const __half2 k1024 = __float2half2_rn(1024.0f);
  const __half2 rg = __hsub2(__halves2half2(__ushort_as_half(0x6400 | r), __ushort_as_half(0x6400 | g)), k1024);
  const __half2 b0 = __hsub2(__halves2half2(__ushort_as_half(0x6400 | b), __ushort_as_half(0x6400)), k1024);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&rg), *reinterpret_cast<const uint32_t*>(&b0));
}
struct PixelFloats {
  float c0, c1, c2;
};
__device__ __forceinline__ PixelFloats widen(uint2 pixel) {
  const __half2 rg = *reinterpret_cast<const __half2*>(&pixel.x);
  const __half2 b0 = *reinterpret_cast<const __half2*>(&pixel.y);
  return {__low2float(rg), __high2float(rg), __low2float(b0)};
}

template <int kChannels>
struct Staging {
  // 4-byte words per staged pixel: three channels as four halves (one 8-byte load reads a
  // pixel); other counts stage one float per channel.
  static __device__ __forceinline__ int pixel_words(int C) { return kChannels == 3 ? 2 : C; }
  // Table offsets count pixels for three channels (the loads are of whole pixels), floats else.
  static __device__ __forceinline__ int offset_unit(int C) { return kChannels == 3 ? 1 : C; }
};

template <int kTaps, int kChannels>  // 0: known only at run time (a.taps, a.channels)
__global__ void __launch_bounds__(kThreads, 6) augment_kernel(AugmentLaunch a) {
  extern __shared__ __align__(16) float smem[];
  __shared__ float u_of_column[kMaxHalo], v_of_row[kMaxHalo];
  __shared__ __align__(8) am::RowTerms row_terms[kMaxHalo];
  __shared__ __align__(8) TableEntry column_table[kMaxTable], row_table[kMaxTable];
  __shared__ Window window;
  const int taps = kTaps > 0 ? kTaps : a.taps;
  const int C = kChannels > 0 ? kChannels : a.channels;
  const int radius = taps / 2;
  const int halo_w = kTileW + 2 * radius, halo_h = kTileH + 2 * radius;
  const int halo = halo_h * halo_w;
  // [C][halo_h][halo_w] sampled values; then the staged window, whose space the row pass
  // reuses for its [C][halo_h][kTileW] output once sampling is done; then the weights.
  float* sampled = smem;
  float* staged = sampled + C * halo;
  float* rows = staged;
  const int second_part = max(kStageFloats, C * halo_h * kTileW);
  float* weights = staged + second_part;

  const int b = blockIdx.z;
  const int x0 = blockIdx.x * kTileW, y0 = blockIdx.y * kTileH;
  const int tid = threadIdx.x, tx = tid % kTileW, ty = tid / kTileW;
  const am::Geometry g = a.geometry;
  const am::SampleParams p{a.top[b], a.left[b], a.cos_a[b], a.sin_a[b], a.flip[b]};
  const int in_plane = g.in_h * g.in_w;
  const uint8_t* image = a.images + static_cast<int64_t>(b) * C * in_plane;
  const int pixel_words = Staging<kChannels>::pixel_words(C);
  const int offset_unit = Staging<kChannels>::offset_unit(C);

  // 0. Per tile: weights, centre offsets (u mirrored for a flipped sample), the window.
  if (tid < taps) weights[tid] = a.weights[static_cast<int64_t>(b) * taps + tid];
  if (tid >= 64 && tid - 64 < halo_w) {
    const float u = am::centre_offset(halo_index(x0 + tid - 64 - radius, g.out_w, radius), g.out_w);
    u_of_column[tid - 64] = p.flip ? -u : u;
  }
  if (tid >= 160 && tid - 160 < halo_h) {
    const float v = am::centre_offset(halo_index(y0 + tid - 160 - radius, g.out_h, radius), g.out_h);
    v_of_row[tid - 160] = v;
    row_terms[tid - 160] = am::row_terms(p.cos_a, p.sin_a, v);
  }
  if (tid == 0) {
    // The halo's extreme centre offsets: reflect padding maps the halo inside the image, so
    // the rows and columns the tile reads lie between those of its clamped first and last.
    auto extreme = [&](int first, int last, int n, bool mirror, float& lo, float& hi) {
      float a_ = am::centre_offset(max(0, first), n), b_ = am::centre_offset(min(n - 1, last), n);
      if (mirror) { a_ = -a_; b_ = -b_; }
      lo = fminf(a_, b_);
      hi = fmaxf(a_, b_);
    };
    float u_lo, u_hi, v_lo, v_hi;
    extreme(x0 - radius, x0 + kTileW - 1 + radius, g.out_w, p.flip != 0, u_lo, u_hi);
    extreme(y0 - radius, y0 + kTileH - 1 + radius, g.out_h, false, v_lo, v_hi);
    window = tile_window(g, p, u_lo, u_hi, v_lo, v_hi, pixel_words);
  }
  __syncthreads();
  const Window win = window;

  if (win.staged()) {
    // Tables of the resized columns and rows the tile can land on.
#pragma unroll 1
    for (int i = tid; i < win.n_cols + win.n_rows; i += kThreads) {
      if (i < win.n_cols) {
        const am::AxisTap t = am::axis_tap(win.ci0 + i, g.scale_x, g.crop_w, p.left);
        column_table[i] = table_entry(t, win.col0, offset_unit);
      } else {
        const int j = i - win.n_cols;
        const am::AxisTap t = am::axis_tap(win.ri0 + j, g.scale_y, g.crop_h, p.top);
        row_table[j] = table_entry(t, win.row0, win.cols * offset_unit);
      }
    }
    // 1. Stage the window: a warp per row, coalesced byte loads, all channels of a pixel. The
    // channel planes' window origins are computed once; the loop only adds 32-bit offsets.
    const uint8_t* origin = image + win.row0 * g.in_w + win.col0;
    if constexpr (kChannels == 3) {
      const uint8_t *p0 = origin, *p1 = origin + in_plane, *p2 = origin + 2 * in_plane;
      uint2* staged_pixels = reinterpret_cast<uint2*>(staged);
      constexpr int kRowsInFlight = 2;  // a warp's loads of 2 rows issued before either is used
#pragma unroll 1
      for (int col = tx; col < win.cols; col += kTileW)
#pragma unroll 1
        for (int r0 = ty; r0 < win.rows; r0 += kRowsInFlight * kWarpsPerTile) {
          uint8_t v[kRowsInFlight][3];
#pragma unroll
          for (int k = 0; k < kRowsInFlight; ++k) {
            const int r = min(r0 + k * kWarpsPerTile, win.rows - 1), o = r * g.in_w + col;
            v[k][0] = p0[o];
            v[k][1] = p1[o];
            v[k][2] = p2[o];
          }
#pragma unroll
          for (int k = 0; k < kRowsInFlight; ++k) {
            const int r = r0 + k * kWarpsPerTile;
            if (r < win.rows)
              staged_pixels[r * win.cols + col] = staged_pixel(v[k][0], v[k][1], v[k][2]);
          }
        }
    } else {
#pragma unroll 1
      for (int r = ty; r < win.rows; r += kWarpsPerTile)
#pragma unroll 1
        for (int col = tx; col < win.cols; col += kTileW)
          for (int c = 0; c < C; ++c)
            staged[(r * win.cols + col) * C + c] =
                am::byte_to_float(origin[c * in_plane + r * g.in_w + col]);
    }
  }
  __syncthreads();

  // 2. Sample the tile and its halo.
  const am::SampleParams unflipped{p.top, p.left, p.cos_a, p.sin_a, 0};  // u is mirrored already
  for (int idx = tid; idx < halo; idx += kThreads) {
    const int ly = idx / halo_w, lx = idx - ly * halo_w;
    const float u = u_of_column[lx];
    const am::Resized r = am::rotate_back(g, p.cos_a, p.sin_a, u, row_terms[ly]);
    const unsigned tc = static_cast<unsigned>(r.ci - win.ci0);
    const unsigned tr = static_cast<unsigned>(r.ri - win.ri0);
    // The tables cover resized pixels inside the image only: a hit is inside.
    if (tc < static_cast<unsigned>(win.n_cols) && tr < static_cast<unsigned>(win.n_rows)) {
      const TableEntry ce = column_table[tc], re = row_table[tr];
      const am::AxisTap x = weights_of(ce), y = weights_of(re);
      const int o00 = re.offset() + ce.offset(), o10 = o00 + re.step(), dc = ce.step();
      if constexpr (kChannels == 3) {
        const uint2* px = reinterpret_cast<const uint2*>(staged);
        const PixelFloats q00 = widen(px[o00]), q01 = widen(px[o00 + dc]), q10 = widen(px[o10]),
                          q11 = widen(px[o10 + dc]);
        sampled[idx] = am::bilerp(q00.c0, q01.c0, q10.c0, q11.c0, x, y);
        sampled[halo + idx] = am::bilerp(q00.c1, q01.c1, q10.c1, q11.c1, x, y);
        sampled[2 * halo + idx] = am::bilerp(q00.c2, q01.c2, q10.c2, q11.c2, x, y);
      } else {
        const float *s00 = staged + o00, *s10 = staged + o10;
        for (int c = 0; c < C; ++c)
          sampled[c * halo + idx] = am::bilerp(s00[c], s00[dc + c], s10[c], s10[dc + c], x, y);
      }
    } else if (!r.inside) {
      for (int c = 0; c < C; ++c) sampled[c * halo + idx] = 0.0f;
    } else {
      const am::Tap t = am::locate_centred(g, unflipped, u, v_of_row[ly]);
      for (int c = 0; c < C; ++c) sampled[c * halo + idx] = am::read(image + c * in_plane, g.in_w, t);
    }
  }
  __syncthreads();

  float w[kTaps > 0 ? kTaps : 1];  // the weights in registers when the size is known
  if constexpr (kTaps > 0) {
#pragma unroll
    for (int k = 0; k < kTaps; ++k) w[k] = weights[k];
  }

  // 3. Blur along rows. Known size: a thread makes two neighbouring outputs of one row from
  // (taps + 1) / 2 8-byte loads (half a warp per row: conflict-free); else one output per thread.
  if constexpr (kTaps > 0) {
    constexpr int kPairsPerRow = kTileW / 2, kRowsPerPass = kThreads / kPairsPerRow;
    const int pair = tid % kPairsPerRow;
    for (int line = tid / kPairsPerRow; line < C * halo_h; line += kRowsPerPass) {
      const float* src = sampled + line * halo_w + 2 * pair;  // line = c * halo_h + ly
      float v[kTaps + 1];
#pragma unroll
      for (int k = 0; k < kTaps + 1; k += 2) {
        const float2 q = *reinterpret_cast<const float2*>(src + k);
        v[k] = q.x;
        v[k + 1] = q.y;
      }
      const float left = am::blur_taps(w, kTaps, [&](int k) { return v[k]; });
      const float right = am::blur_taps(w, kTaps, [&](int k) { return v[k + 1]; });
      *reinterpret_cast<float2*>(rows + line * kTileW + 2 * pair) = make_float2(left, right);
    }
  } else {
    for (int line = ty; line < C * halo_h; line += kWarpsPerTile) {
      const float* src = sampled + line * halo_w + tx;
      rows[line * kTileW + tx] = am::blur_taps(weights, taps, [&](int k) { return src[k]; });
    }
  }
  __syncthreads();

  // 4. Blur along columns, normalize, write: a warp writes 32 consecutive floats of one row.
  const int x = x0 + tx, y_first = y0 + ty * kRowsPerThread;
  if (x >= g.out_w) return;
  const int rows_here = min(kRowsPerThread, g.out_h - y_first);  // < kRowsPerThread: last tile
  const int64_t out_plane = static_cast<int64_t>(g.out_h) * g.out_w;
  float* dst = a.out + static_cast<int64_t>(b) * C * out_plane +
               static_cast<int64_t>(y_first) * g.out_w + x;
  for (int c = 0; c < C; ++c, dst += out_plane) {
    const float* col = rows + (c * halo_h + ty * kRowsPerThread) * kTileW + tx;
    const float mean = a.mean[c], inv_std = a.inv_std[c];
    float out[kRowsPerThread];
    if constexpr (kTaps > 0) {
      float window_values[kRowsPerThread + kTaps - 1];
#pragma unroll
      for (int j = 0; j < kRowsPerThread + kTaps - 1; ++j) window_values[j] = col[j * kTileW];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        out[r] = am::normalize(am::blur_taps(w, kTaps, [&](int k) { return window_values[r + k]; }),
                               mean, inv_std);
    } else {
      for (int r = 0; r < kRowsPerThread; ++r)
        out[r] = am::normalize(
            am::blur_taps(weights, taps, [&](int k) { return col[(r + k) * kTileW]; }), mean,
            inv_std);
    }
    if (rows_here == kRowsPerThread) {  // every tile but a partial last row of tiles
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) dst[r * g.out_w] = out[r];
    } else {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        if (r < rows_here) dst[r * g.out_w] = out[r];
    }
  }
}

template <int kTaps, int kChannels>
void launch_augment_for(const AugmentLaunch& args, cudaStream_t stream) {
  const int radius = args.taps / 2;
  const int halo_h = kTileH + 2 * radius, halo_w = kTileW + 2 * radius;
  // As the kernel lays it out: sampled halo, then staged window / row-pass output, then weights.
  const size_t floats = static_cast<size_t>(args.channels) * halo_h * halo_w +
                        std::max(kStageFloats, args.channels * halo_h * kTileW) + args.taps;
  const size_t smem = sizeof(float) * floats;
  const dim3 grid((args.geometry.out_w + kTileW - 1) / kTileW,
                  (args.geometry.out_h + kTileH - 1) / kTileH, args.batch);
  if (smem > 40 * 1024)  // 48 KB less the static arrays: above that, opt in
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
