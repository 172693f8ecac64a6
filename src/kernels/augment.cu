// The augmentation kernels: one draws every sample's parameters, one augments the whole batch.
//
// The augment kernel: a block makes a 32x32 tile of output pixels of one sample, all channels.
// It reads the source one of two ways (kGather; the same values to the bit): texture gathers
// (three channels, a compiled blur size, the batch readable as textures: AugmentLaunch's
// textures) or a staged window (any case):
//   0. per tile: the blur weights and the centre offsets of the tile's (halo'd) rows and
//      columns; staged window only: the window the tile reads (a warp's lanes together), and
//      tables of the resized rows and columns the tile's rotation can land on (their offsets in
//      the window and their bilinear weights);
//   1. staged window only: stage the window (a few hundred source pixels) in shared memory with
//      coalesced loads, a pixel's channels as consecutive floats in units of 1/255
//      (augment_math::unit_byte);
//   2. sample the crop-resize-rotate composition for the tile plus a blur halo: rotate back to
//      a resized pixel, then either compute its resize taps and gather each channel's 2x2 bytes
//      (three gathers at one coordinate, one texture per channel, whose normalized floats are
//      already those units) or look its taps up and read four staged pixels; interpolate;
//   3. blur rows (the halo rows too), four outputs per thread from 16-byte loads;
//   4. blur columns, normalize, write; with a compiled blur size a warp makes 16 rows of one
//      channel, each lane sliding down one column, so each value it loads serves up to `taps`
//      outputs.
// The uint8 source is read once and the float output written once, with no intermediate image
// in DRAM. The blur size and the channel count are template parameters for the common cases
// (weights in registers, loops unrolled); other values run the same code with the sizes read at
// run time. A tile whose window or tables do not fit (only extreme downscaling makes them that
// large) samples with the plain per-pixel arithmetic from global memory. The profiles of
// earlier versions (docs/notes/augment-kernel.md) were bound first by instruction issue (integer
// address work, integer-to-float conversions, unfused multiply-adds), then by shared-memory
// wavefronts (a window of 16-byte float pixels: four 16-byte loads per sampled pixel), then by the
// integer pipe (a window of byte pixels: a byte permute per value), then — with texture gathers —
// by the latency of each pixel's gathers, and now (v14: the three in flight together) by
// instruction issue again, 76% of the issue slots busy (docs/notes/augment-kernel.md).
#include <algorithm>
#include <string>

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
constexpr int kStripRows = 16;                          // the same, blur size compiled in
constexpr int kMaxRadius = 31;                          // AugmentSpec allows taps <= 63
constexpr int kMaxHalo = kTileW + 2 * kMaxRadius;
// 14 KB: the cls workload's tiles read about 29x29 pixels (10 KB as three floats each; up to 1,194
// pixels fit). 6 blocks of 256 threads per SM fit the H200's shared memory with this and the
// padded sampled rows, not with 16 KB.
constexpr int kStageFloats = 3584;
constexpr int kMaxTable = 64;  // resized rows (columns) a tile can land on; cls: <= 60
static_assert(kTileH % kWarpsPerTile == 0, "thread rows must divide the tile height");
static_assert(kTileW == kTileH, "the halo arrays assume a square tile");
static_assert(kAugmentMaxChannels * (kTileH / kStripRows) <= kWarpsPerTile,
              "the column pass has a warp per channel and strip");

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
  __device__ bool tabulated() const { return n_cols > 0; }
};

constexpr unsigned kFullMask = 0xffffffffu;

// Computed by one whole warp, every lane with the same arguments: lane k & 3 rotates corner k
// (the extremes of an affine map are at the corners), two butterfly shuffles give every lane the
// extremes, and lanes 0-3 each compute one of the four axis taps that bound the source read. One
// thread doing it all was the block's longest serial chain — some 200 dependent instructions that
// every warp of the tile waited for at the first barrier (11% of the kernel's warp samples on the
// H200, at the instruction after that barrier).
__device__ Window warp_tile_window(const am::Geometry& g, const am::SampleParams& p, float u_lo,
                                   float u_hi, float v_lo, float v_hi, int pixel_words, int lane) {
  const int k = lane & 3;
  const am::Rotated q = am::rotate_to_grid(g, p.cos_a, p.sin_a, (k & 2) ? u_hi : u_lo,
                                           (k & 1) ? v_hi : v_lo);  // rotate_back's
  float cmin = q.fc, cmax = q.fc, rmin = q.fr, rmax = q.fr;
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    cmin = fminf(cmin, __shfl_xor_sync(kFullMask, cmin, m));
    cmax = fmaxf(cmax, __shfl_xor_sync(kFullMask, cmax, m));
    rmin = fminf(rmin, __shfl_xor_sync(kFullMask, rmin, m));
    rmax = fmaxf(rmax, __shfl_xor_sync(kFullMask, rmax, m));
  }
  // Every lane holds the same extremes from here on, so the early returns are warp-uniform.
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
  // Lane 0: the first column's i0, 1: the last column's i1, 2 and 3: the same for rows.
  const am::AxisTap t =
      k < 2 ? am::axis_tap(k == 0 ? w.ci0 : ci_hi, g.scale_x, g.shift_x, g.crop_w, p.left)
            : am::axis_tap(k == 2 ? w.ri0 : ri_hi, g.scale_y, g.shift_y, g.crop_h, p.top);
  const int bound = (k & 1) ? t.i1 : t.i0;
  w.col0 = __shfl_sync(kFullMask, bound, 0);
  w.cols = __shfl_sync(kFullMask, bound, 1) - w.col0 + 1;
  w.row0 = __shfl_sync(kFullMask, bound, 2);
  w.rows = __shfl_sync(kFullMask, bound, 3) - w.row0 + 1;
  return w.rows * w.cols * pixel_words <= kStageFloats ? w : none;
}

// A tabulated resized row or column, 8 bytes (one load): where its two source rows (columns)
// are, and the bilinear weight l of i1 (1 - l of i0, computed as axis_tap computes it, so the
// rounding is the same). Where: where they start in the staged window, in bytes (so the
// sampling adds them to an address as they are) — i0 at `offset`, i1 at offset + step, both
// below 4 * kStageFloats, packed as offset | step << 16.
struct TableEntry {
  uint32_t where;
  float l;
  __device__ int offset() const { return static_cast<int>(where & 0xffffu); }
  __device__ int step() const { return static_cast<int>(where >> 16); }
};
static_assert(4 * kStageFloats <= 0x10000, "table offsets are 16-bit byte offsets");

__device__ __forceinline__ TableEntry table_entry(const am::AxisTap& t, int origin, int stride) {
  const int offset = (t.i0 - origin) * stride, step = (t.i1 - t.i0) * stride;
  return {static_cast<uint32_t>(offset) | (static_cast<uint32_t>(step) << 16), t.l};
}

__device__ __forceinline__ am::AxisTap weights_of(const TableEntry& e) {
  return {0, 0, e.l, 1.0f - e.l};
}

// Floats per row of a sampled plane: the halo's width rounded up to whole 16-byte groups.
__host__ __device__ constexpr int padded_row(int halo_w) { return (halo_w + 3) & ~3; }

// Programmatic dependent launch (sm_90 and later; elsewhere these are no-ops and launches
// serialize as usual). The augment kernel is launched allowed to start before the stream's
// previous kernel has finished (launch_augment), so its blocks are resident and its launch
// latency spent while that kernel drains: the last blocks of the previous augment launch, or
// the draw kernel. It touches no global memory before wait_for_previous_grid(), which returns
// once the previous kernel has completed and its writes are visible — the same ordering as a
// plain launch. allow_next_grid(): a kernel launched after this one the same way may start
// (and wait) once every block of this one has begun.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A tile's place and sizes, the same in every thread of its block.
struct Tile {
  int b, x0, y0;    // sample, first output column and row
  int tid, tx, ty;  // thread, its column and thread row
  int taps, C, radius;
  int halo_w, halo_h, halo;
  int sampled_w, plane;  // floats per sampled row (padded), per sampled channel plane
  int in_plane;          // source pixels per channel
  const uint8_t* image;  // the sample's source
  am::SampleParams p;
};

// 0. Per tile: the blur weights and the centre offsets of the halo'd rows and columns (u
// mirrored for a flipped sample), with the rotation's terms of each row.
__device__ __forceinline__ void load_tile_terms(const AugmentLaunch& a, const am::Geometry& g,
                                                const Tile& t, float* weights, float* u_of_column,
                                                float* v_of_row, am::RowTerms* row_terms) {
  const int tid = t.tid, radius = t.radius;
  if (tid < t.taps) weights[tid] = a.weights[static_cast<int64_t>(t.b) * t.taps + tid];
  if (tid >= 64 && tid - 64 < t.halo_w) {
    const float u =
        am::centre_offset(halo_index(t.x0 + tid - 64 - radius, g.out_w, radius), g.out_w);
    u_of_column[tid - 64] = t.p.flip ? -u : u;
  }
  if (tid >= 160 && tid - 160 < t.halo_h) {
    const int row = halo_index(t.y0 + tid - 160 - radius, g.out_h, radius);
    const float v = am::centre_offset(row, g.out_h);
    v_of_row[tid - 160] = v;
    row_terms[tid - 160] = am::row_terms(g, t.p.cos_a, t.p.sin_a, v);
  }
}

// 0. The staged window the tile reads: by warp 0, whole and converged; thread 0 stores it.
__device__ __forceinline__ void find_window(const am::Geometry& g, const Tile& t, Window& window) {
  // The halo's extreme centre offsets: reflect padding maps the halo inside the image, so the
  // rows and columns the tile reads lie between those of its clamped first and last.
  auto extreme = [&](int first, int last, int n, bool mirror, float& lo, float& hi) {
    float a_ = am::centre_offset(max(0, first), n), b_ = am::centre_offset(min(n - 1, last), n);
    if (mirror) {
      a_ = -a_;
      b_ = -b_;
    }
    lo = fminf(a_, b_);
    hi = fmaxf(a_, b_);
  };
  float u_lo, u_hi, v_lo, v_hi;
  extreme(t.x0 - t.radius, t.x0 + kTileW - 1 + t.radius, g.out_w, t.p.flip != 0, u_lo, u_hi);
  extreme(t.y0 - t.radius, t.y0 + kTileH - 1 + t.radius, g.out_h, false, v_lo, v_hi);
  const int lane = t.tid % 32;
  const Window w = warp_tile_window(g, t.p, u_lo, u_hi, v_lo, v_hi, t.C, lane);
  if (t.tid == 0) window = w;
}

// 1. Tables of the resized columns and rows the tile can land on, and the window staged: a warp
// per row, coalesced byte loads, all channels of a pixel (a pixel's channels as consecutive
// floats, a table entry's offsets in bytes of them).
template <int kChannels>
__device__ __forceinline__ void tabulate_and_stage(const am::Geometry& g, const Tile& t,
                                                   const Window& win, TableEntry* column_table,
                                                   TableEntry* row_table, float* staged) {
  const int tid = t.tid, tx = t.tx, ty = t.ty, C = t.C, in_plane = t.in_plane;
  const int pixel_bytes = 4 * C;
#pragma unroll 1
  for (int i = tid; i < win.n_cols + win.n_rows; i += kThreads) {
    if (i < win.n_cols) {
      const am::AxisTap q = am::axis_tap(win.ci0 + i, g.scale_x, g.shift_x, g.crop_w, t.p.left);
      column_table[i] = table_entry(q, win.col0, pixel_bytes);
    } else {
      const int j = i - win.n_cols;
      const am::AxisTap q = am::axis_tap(win.ri0 + j, g.scale_y, g.shift_y, g.crop_h, t.p.top);
      row_table[j] = table_entry(q, win.row0, win.cols * pixel_bytes);
    }
  }
  // The channel planes' window origins are computed once; the loop only adds 32-bit offsets.
  const uint8_t* origin = t.image + win.row0 * g.in_w + win.col0;
  if constexpr (kChannels == 3) {
    const uint8_t *p0 = origin, *p1 = origin + in_plane, *p2 = origin + 2 * in_plane;
    // A warp's loads of 2 rows are issued before either is used (3 or 4 made the kernel
    // spill at 40 registers).
    constexpr int kRowsInFlight = 2;
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
          if (r < win.rows) {
            float* pixel = staged + 3 * (r * win.cols + col);
            pixel[0] = am::unit_byte(v[k][0]);
            pixel[1] = am::unit_byte(v[k][1]);
            pixel[2] = am::unit_byte(v[k][2]);
          }
        }
      }
  } else {
#pragma unroll 1
    for (int r = ty; r < win.rows; r += kWarpsPerTile)
#pragma unroll 1
      for (int col = tx; col < win.cols; col += kTileW)
        for (int c = 0; c < C; ++c)
          staged[(r * win.cols + col) * C + c] =
              am::unit_byte(origin[c * in_plane + r * g.in_w + col]);
  }
}

// 2. Sample the tile and its halo by texture gathers: the rotation, then the resize's taps
// computed here (gather_tap, which the tables' axis_tap is built on) — tables made by a few
// warps were a dependent chain every warp waited for at a barrier (10% of the kernel's warp
// samples), while the sampling waits on its gathers anyway. A gather at (i0 + 1, j0 + 1)
// fetches texels i0, i0 + 1 of rows j0, j0 + 1 (texel centres at + 0.5); its texels: x
// bottom-left, y bottom-right, z top-right, w top-left.
__device__ __forceinline__ void sample_by_gathers(const AugmentLaunch& a, const am::Geometry& g,
                                                  const Tile& t, const float* u_of_column,
                                                  const am::RowTerms* row_terms, float* sampled) {
  const int b = t.b, halo_w = t.halo_w, sampled_w = t.sampled_w, plane = t.plane;
  const am::SampleParams& p = t.p;
  const cudaTextureObject_t* planes = a.textures.handles[b / a.textures.samples_per_texture];
  const cudaTextureObject_t plane0 = planes[0], plane1 = planes[1], plane2 = planes[2];
  const int first_row = (b % a.textures.samples_per_texture) * t.C * g.in_h;
  const float column_origin = static_cast<float>(p.left + 1);
  const float row_origin = static_cast<float>(first_row + p.top + 1);
  // The sizes the loop compares against are Geometry's floats, kernel-parameter operands (not
  // converted here), and the taps' clamp is a min (not a branch): so the compiler keeps a
  // pixel's three gathers in flight together within 32 registers (docs/notes/augment-kernel.md,
  // v14).
#pragma unroll 1
  for (int idx = t.tid; idx < t.halo; idx += kThreads) {
    const int ly = idx / halo_w, lx = idx - ly * halo_w, at = ly * sampled_w + lx;
    const am::Rotated q = am::rotate_to_grid(p.cos_a, p.sin_a, u_of_column[lx], row_terms[ly]);
    const float ci = am::floor_f(q.fc), ri = am::floor_f(q.fr);  // rotate_back's pixel
    if (!(ci >= 0.0f && ci < g.out_w_f && ri >= 0.0f && ri < g.out_h_f)) {
      sampled[at] = sampled[plane + at] = sampled[2 * plane + at] = 0.0f;
      continue;
    }
    const am::GatherTap column_tap = am::gather_tap(ci, g.scale_x, g.shift_x, g.last_col);
    const am::GatherTap row_tap = am::gather_tap(ri, g.scale_y, g.shift_y, g.last_row);
    const float gx = column_tap.i0 + column_origin, gy = row_tap.i0 + row_origin;
    const am::AxisTap x{0, 0, column_tap.l, column_tap.one_minus_l};
    const am::AxisTap y{0, 0, row_tap.l, row_tap.one_minus_l};
    const float4 q0 = tex2Dgather<float4>(plane0, gx, gy, 0);
    const float4 q1 = tex2Dgather<float4>(plane1, gx, gy, 0);
    const float4 q2 = tex2Dgather<float4>(plane2, gx, gy, 0);
    sampled[at] = am::bilerp(q0.w, q0.z, q0.x, q0.y, x, y);
    sampled[plane + at] = am::bilerp(q1.w, q1.z, q1.x, q1.y, x, y);
    sampled[2 * plane + at] = am::bilerp(q2.w, q2.z, q2.x, q2.y, x, y);
  }
}

// 2. Sample the tile and its halo from the staged window: rotate back to a resized pixel, look
// its taps up and read four staged pixels; a pixel the tables do not cover is sampled the plain
// way from global memory.
__device__ __forceinline__ void sample_staged(const am::Geometry& g, const Tile& t,
                                              const Window& win, const float* u_of_column,
                                              const float* v_of_row, const am::RowTerms* row_terms,
                                              const TableEntry* column_table,
                                              const TableEntry* row_table, const float* staged,
                                              float* sampled) {
  const int C = t.C, halo_w = t.halo_w, sampled_w = t.sampled_w, plane = t.plane;
  const am::SampleParams& p = t.p;
  const am::SampleParams unflipped{p.top, p.left, p.cos_a, p.sin_a, 0};  // u is mirrored already
  for (int idx = t.tid; idx < t.halo; idx += kThreads) {
    const int ly = idx / halo_w, lx = idx - ly * halo_w, at = ly * sampled_w + lx;
    const float u = u_of_column[lx];
    const am::Resized r = am::rotate_back(g, p.cos_a, p.sin_a, u, row_terms[ly]);
    const unsigned tc = static_cast<unsigned>(r.ci - win.ci0);
    const unsigned tr = static_cast<unsigned>(r.ri - win.ri0);
    // The tables cover resized pixels inside the image only: a hit is inside.
    if (tc < static_cast<unsigned>(win.n_cols) && tr < static_cast<unsigned>(win.n_rows)) {
      const TableEntry ce = column_table[tc], re = row_table[tr];
      const am::AxisTap x = weights_of(ce), y = weights_of(re);
      const char* s00 = reinterpret_cast<const char*>(staged) + re.offset() + ce.offset();
      const char* s10 = s00 + re.step();
      const int dc = ce.step();
      auto floats = [](const char* q) { return reinterpret_cast<const float*>(q); };
      const float *f00 = floats(s00), *f01 = floats(s00 + dc);
      const float *f10 = floats(s10), *f11 = floats(s10 + dc);
      for (int c = 0; c < C; ++c)
        sampled[c * plane + at] = am::bilerp(f00[c], f01[c], f10[c], f11[c], x, y);
    } else if (!r.inside) {
      for (int c = 0; c < C; ++c) sampled[c * plane + at] = 0.0f;
    } else {
      const am::Tap q = am::locate_centred(g, unflipped, u, v_of_row[ly]);
      for (int c = 0; c < C; ++c)
        sampled[c * plane + at] = am::read(t.image + c * t.in_plane, g.in_w, q, am::unit_byte);
    }
  }
}

// 3. Blur along rows, in place: a line's outputs (its first kTileW values) overwrite its
// inputs once every lane that reads the line has read it — the lanes of one warp, so a
// __syncwarp orders them, and the loops run the same number of times in every lane of a warp.
// Known size: a thread makes four neighbouring outputs of one row from (taps + 6) / 4 16-byte
// loads (a quarter warp per row); else one output per thread.
template <int kTaps>
__device__ __forceinline__ void blur_rows(const Tile& t, const float (&w)[kTaps > 0 ? kTaps : 1],
                                          const float* weights, float* sampled) {
  const int tid = t.tid, sampled_w = t.sampled_w;
  const int lines = t.C * t.halo_h;  // line = c * halo_h + ly
  if constexpr (kTaps > 0) {
    constexpr int kQuadsPerRow = kTileW / 4, kRowsPerPass = kThreads / kQuadsPerRow;
    constexpr int kLoads = (kTaps + 3 + 3) / 4;  // float4s covering the taps + 3 inputs
    static_assert(kTileW - 4 + 4 * kLoads <= padded_row(kTileW + 2 * (kTaps / 2)),
                  "the last quad's loads stay inside its padded row");
    const int quad = tid % kQuadsPerRow;
    for (int first = 0; first < lines; first += kRowsPerPass) {
      const int line = first + tid / kQuadsPerRow;
      // inputs past the halo's width (row padding) are loaded, never used
      float4* row = reinterpret_cast<float4*>(sampled + line * sampled_w);
      float4 out;
      if (line < lines) {
        float v[4 * kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const float4 q = row[quad + j];
          v[4 * j] = q.x;
          v[4 * j + 1] = q.y;
          v[4 * j + 2] = q.z;
          v[4 * j + 3] = q.w;
        }
        out.x = am::blur_taps(w, kTaps, [&](int k) { return v[k]; });
        out.y = am::blur_taps(w, kTaps, [&](int k) { return v[k + 1]; });
        out.z = am::blur_taps(w, kTaps, [&](int k) { return v[k + 2]; });
        out.w = am::blur_taps(w, kTaps, [&](int k) { return v[k + 3]; });
      }
      __syncwarp();
      if (line < lines) row[quad] = out;
    }
  } else {
    for (int line = t.ty; line < lines; line += kWarpsPerTile) {  // a warp per line
      float* row = sampled + line * sampled_w;
      const float out = am::blur_taps(weights, t.taps, [&](int k) { return row[t.tx + k]; });
      __syncwarp();
      row[t.tx] = out;
    }
  }
}

// 4. Blur along columns, normalize, write: a warp writes 32 consecutive floats of one row.
template <int kTaps>
__device__ __forceinline__ void blur_columns_and_write(const AugmentLaunch& a,
                                                       const am::Geometry& g, const Tile& t,
                                                       const float (&w)[kTaps > 0 ? kTaps : 1],
                                                       const float* weights, const float* sampled) {
  const int tid = t.tid, tx = t.tx, b = t.b, C = t.C, halo_h = t.halo_h;
  const int sampled_w = t.sampled_w;
  if constexpr (kTaps > 0) {
    // Known size: warp 2c + k makes channel c's rows 16k .. 16k + 15, a column per lane, sliding
    // a window of kTaps values down it: 22 loads for 16 outputs (runs of 4 rows loaded 10 for 4).
    // Six of the eight warps work here; the other blocks on the SM use the rest.
    constexpr int kStripsPerTile = kTileH / kStripRows;
    const int warp = tid / kTileW, c = warp / kStripsPerTile, strip = warp % kStripsPerTile;
    const int x = t.x0 + tx, y_first = t.y0 + strip * kStripRows;
    if (c >= C || x >= g.out_w || y_first >= g.out_h) return;
    const int rows_here = min(kStripRows, g.out_h - y_first);  // < kStripRows: last tile
    const int64_t out_plane = static_cast<int64_t>(g.out_h) * g.out_w;
    float* dst = a.out + (static_cast<int64_t>(b) * C + c) * out_plane +
                 static_cast<int64_t>(y_first) * g.out_w + x;
    const float* col = sampled + (c * halo_h + strip * kStripRows) * sampled_w + tx;
    const am::Normalization n = a.normalization[c];
    float window_values[kTaps];
#pragma unroll
    for (int k = 0; k < kTaps - 1; ++k) window_values[k] = col[k * sampled_w];
    auto next_output = [&](int r) {  // output row r; slides the window down by one
      window_values[kTaps - 1] = col[(r + kTaps - 1) * sampled_w];
      const float out =
          am::normalize(am::blur_taps(w, kTaps, [&](int k) { return window_values[k]; }), n);
#pragma unroll
      for (int k = 0; k < kTaps - 1; ++k) window_values[k] = window_values[k + 1];
      return out;
    };
    if (rows_here == kStripRows) {  // every tile but a partial last row of tiles
#pragma unroll
      for (int r = 0; r < kStripRows; ++r) dst[r * g.out_w] = next_output(r);
    } else {
#pragma unroll
      for (int r = 0; r < kStripRows; ++r) {
        const float out = next_output(r);
        if (r < rows_here) dst[r * g.out_w] = out;
      }
    }
  } else {
    // A size known at run time: each thread makes 4 consecutive rows of one column, every
    // channel.
    const int x = t.x0 + tx, y_first = t.y0 + t.ty * kRowsPerThread;
    if (x >= g.out_w) return;
    const int rows_here = min(kRowsPerThread, g.out_h - y_first);  // < kRowsPerThread: last tile
    const int64_t out_plane = static_cast<int64_t>(g.out_h) * g.out_w;
    float* dst = a.out + static_cast<int64_t>(b) * C * out_plane +
                 static_cast<int64_t>(y_first) * g.out_w + x;
    for (int c = 0; c < C; ++c, dst += out_plane) {
      const float* col = sampled + (c * halo_h + t.ty * kRowsPerThread) * sampled_w + tx;
      const am::Normalization n = a.normalization[c];
      for (int r = 0; r < kRowsPerThread && r < rows_here; ++r)
        dst[r * g.out_w] = am::normalize(
            am::blur_taps(weights, t.taps, [&](int k) { return col[(r + k) * sampled_w]; }), n);
    }
  }
}

// kTaps, kChannels: 0 when known only at run time (a.taps, a.channels). kGather: sample by
// texture gathers (a.textures; three channels, a compiled blur size) instead of staging the window.
// Blocks per SM: eight with texture gathers (32 registers, no spills, 19 KB of shared memory),
// a pixel's three gathers in flight together (v12 had them one and then two at 32 registers,
// together only at 40, six blocks: docs/notes/augment-kernel.md, v14); six for the staged window
// with a compiled blur size (40 registers; its shared memory allows six too); five for a blur size
// known only at run time, whose extra index arithmetic would spill.
template <int kTaps, int kChannels, bool kGather>
__global__ void __launch_bounds__(kThreads, kGather ? 8 : (kTaps > 0 ? 6 : 5))
    augment_kernel(AugmentLaunch a) {
  static_assert(!kGather || (kChannels == 3 && kTaps > 0), "gathers: 3 channels, a compiled blur");
  extern __shared__ __align__(16) float smem[];
  __shared__ float u_of_column[kMaxHalo], v_of_row[kMaxHalo];
  __shared__ __align__(8) am::RowTerms row_terms[kMaxHalo];
  // The column table, then the row table: one array, so that one address register (and an
  // immediate offset) reaches both in the sampling loop.
  __shared__ __align__(8) TableEntry tables[2 * kMaxTable];
  TableEntry* const column_table = tables;
  TableEntry* const row_table = tables + kMaxTable;
  __shared__ Window window;
  Tile t;
  t.taps = kTaps > 0 ? kTaps : a.taps;
  t.C = kChannels > 0 ? kChannels : a.channels;
  t.radius = t.taps / 2;
  t.halo_w = kTileW + 2 * t.radius;
  t.halo_h = kTileH + 2 * t.radius;
  t.halo = t.halo_h * t.halo_w;
  // [C][halo_h][sampled_w] sampled values, rows padded to 16 bytes for the row pass's 16-byte
  // loads, which writes its output over them; then the staged window (staged sampling only);
  // then the weights.
  t.sampled_w = padded_row(t.halo_w);
  t.plane = t.halo_h * t.sampled_w;
  float* sampled = smem;
  float* staged = sampled + t.C * t.plane;
  float* weights = staged + (kGather ? 0 : kStageFloats);

  wait_for_previous_grid();
  allow_next_grid();
  t.b = blockIdx.z;
  t.x0 = blockIdx.x * kTileW;
  t.y0 = blockIdx.y * kTileH;
  t.tid = threadIdx.x;
  t.tx = t.tid % kTileW;
  t.ty = t.tid / kTileW;
  const am::Geometry g = a.geometry;
  const int b = t.b;
  t.p = am::SampleParams{a.top[b], a.left[b], a.cos_a[b], a.sin_a[b], a.flip[b]};
  t.in_plane = g.in_h * g.in_w;
  t.image = a.images + static_cast<int64_t>(b) * t.C * t.in_plane;

  load_tile_terms(a, g, t, weights, u_of_column, v_of_row, row_terms);
  // A staged window: warp 0 finds it, and after a barrier every thread tabulates and stages.
  // Texture gathers need neither: each pixel locates its source itself.
  if (!kGather && t.tid < 32) find_window(g, t, window);  // a whole warp, converged
  __syncthreads();
  const Window win = kGather ? Window{} : window;
  if (!kGather && win.tabulated())
    tabulate_and_stage<kChannels>(g, t, win, column_table, row_table, staged);
  if (!kGather) __syncthreads();

  if constexpr (kGather)
    sample_by_gathers(a, g, t, u_of_column, row_terms, sampled);
  else
    sample_staged(g, t, win, u_of_column, v_of_row, row_terms, column_table, row_table, staged,
                  sampled);
  __syncthreads();

  float w[kTaps > 0 ? kTaps : 1];  // the weights in registers when the size is known
  if constexpr (kTaps > 0) {
#pragma unroll
    for (int k = 0; k < kTaps; ++k) w[k] = weights[k];
  }
  blur_rows<kTaps>(t, w, weights, sampled);
  __syncthreads();
  blur_columns_and_write<kTaps>(a, g, t, w, weights, sampled);
}

template <int kTaps, int kChannels, bool kGather = false>
void launch_augment_for(const AugmentLaunch& args, cudaStream_t stream) {
  const int radius = args.taps / 2;
  const int halo_h = kTileH + 2 * radius, halo_w = kTileW + 2 * radius;
  // As the kernel lays it out: sampled halo, then the staged window, then weights.
  const size_t floats = static_cast<size_t>(args.channels) * halo_h * padded_row(halo_w) +
                        (kGather ? 0 : kStageFloats) + args.taps;
  const size_t smem = sizeof(float) * floats;
  const dim3 grid((args.geometry.out_w + kTileW - 1) / kTileW,
                  (args.geometry.out_h + kTileH - 1) / kTileH, args.batch);
  if (smem > 40 * 1024)  // 48 KB less the static arrays: above that, opt in
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(augment_kernel<kTaps, kChannels, kGather>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute early_start{};
  early_start.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early_start.val.programmaticStreamSerializationAllowed = 1;
  if (args.programmatic_launch) {
    config.attrs = &early_start;
    config.numAttrs = 1;
  }
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&config, augment_kernel<kTaps, kChannels, kGather>, args));
}

// The blur sizes the kernel is compiled for (weights in registers, loops unrolled; the only
// ones with texture gathers): this one list drives the launch and why_no_gathers.
template <int... kSizes>
struct BlurSizes {
  static bool contain(int taps) { return ((taps == kSizes) || ...); }
  static std::string listed() {
    std::string out;
    ((out += (out.empty() ? "" : ", ") + std::to_string(kSizes)), ...);
    return out;
  }
  // Launches the variant compiled for args.taps; false where there is none.
  template <int kChannels, bool kGather>
  static bool launch(const AugmentLaunch& args, cudaStream_t stream) {
    return ((args.taps == kSizes &&
             (launch_augment_for<kSizes, kChannels, kGather>(args, stream), true)) ||
            ...);
  }
};
using CompiledBlurSizes = BlurSizes<1, 3, 5, 7, 9>;

template <int kChannels>
void launch_augment_channels(const AugmentLaunch& args, cudaStream_t stream) {
  if (!CompiledBlurSizes::launch<kChannels, false>(args, stream))
    launch_augment_for<0, kChannels>(args, stream);
}

__global__ void draw_kernel(DrawLaunch d) {
  allow_next_grid();  // the augment launch that follows may start; it waits for these draws
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= d.batch) return;
  uint64_t seed, offset;
  d.rng.unpack(seed, offset);  // read when the (replayed) kernel runs
  const augment_math::Drawn s =
      augment_math::draw_sample(d.spec, seed, offset, static_cast<uint64_t>(b),
                                d.weights + static_cast<int64_t>(b) * d.spec.taps);
  d.top[b] = s.top;
  d.left[b] = s.left;
  d.flip[b] = s.flip;
  d.angle_deg[b] = s.angle_deg;
  d.cos_a[b] = s.cos_a;
  d.sin_a[b] = s.sin_a;
  d.sigma[b] = s.sigma;
}

}  // namespace

std::string why_no_gathers(int channels, int taps) {
  if (channels == kGatherChannels && CompiledBlurSizes::contain(taps)) return "";
  return "the kernel gathers for " + std::to_string(kGatherChannels) + " channels and blur sizes " +
         CompiledBlurSizes::listed() + " only; got " + std::to_string(channels) +
         " channels, blur " + std::to_string(taps);
}

void launch_augment(const AugmentLaunch& args, cudaStream_t stream) {
  if (args.batch == 0) return;
  TANDEM_CHECK_ARG(args.batch <= 65535, "batch of ", args.batch,
                   " images is too large for one augment launch: expected at most 65535");
  if (args.textures.count > 0) {
    const std::string why_not = why_no_gathers(args.channels, args.taps);
    TANDEM_CHECK_ARG(why_not.empty(), "texture gathers are not possible here: ", why_not);
    TANDEM_CHECK_ARG(args.textures.samples_per_texture > 0 &&
                         args.textures.count * args.textures.samples_per_texture >= args.batch,
                     args.textures.count, " textures of ", args.textures.samples_per_texture,
                     " samples do not cover a batch of ", args.batch);
    CompiledBlurSizes::launch<kGatherChannels, true>(args, stream);  // why_not: it has one
    return;
  }
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
