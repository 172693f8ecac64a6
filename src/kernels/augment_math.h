// The per-pixel arithmetic of the fused augmentation, shared verbatim by the CPU reference
// (augment.cpp) and the CUDA kernel (augment.cu): the same code on both sides is what makes CPU
// and GPU outputs agree to the bit. Every multiply-add that may fuse is written as fmadd() (one
// rounding on both sides); everything else must not fuse: augment.cu is compiled with
// -fmad=false and augment.cpp with -ffp-contract=off.
#pragma once

#include <cstdint>
#ifndef __CUDA_ARCH__
#include <cmath>
#endif

#ifdef __CUDACC__
#define TANDEM_HD __host__ __device__ __forceinline__
#define TANDEM_UNROLL _Pragma("unroll")
#else
#define TANDEM_HD inline
#define TANDEM_UNROLL  // the host compiler's own choice (it does not know nvcc's pragma)
#endif

namespace tandem::augment_math {

/// Sizes shared by every sample of a batch (make_geometry fills the derived fields).
struct Geometry {
  int in_h, in_w;          ///< source image
  int crop_h, crop_w;      ///< random crop
  int out_h, out_w;        ///< after resize (and rotation, which keeps the size)
  float scale_y, scale_x;  ///< crop / out, the resize's source step per output pixel
  float shift_y, shift_x;  ///< 0.5 * scale - 0.5: resized index i reads at i * scale + shift
  float half_h, half_w;    ///< out / 2: the image centre, from a pixel edge
  // The sizes as floats, for the kernel's sampling loop: it reads them from its parameters as
  // operands, where values it computed would hold registers (docs/notes/augment-kernel.md, v14).
  float out_h_f, out_w_f;    ///< out_h, out_w
  float last_row, last_col;  ///< crop_h - 1, crop_w - 1: the crop's last source index
};

inline Geometry make_geometry(int in_h, int in_w, int crop_h, int crop_w, int out_h, int out_w) {
  Geometry g{};
  g.in_h = in_h;
  g.in_w = in_w;
  g.crop_h = crop_h;
  g.crop_w = crop_w;
  g.out_h = out_h;
  g.out_w = out_w;
  g.scale_y = static_cast<float>(crop_h) / static_cast<float>(out_h);
  g.scale_x = static_cast<float>(crop_w) / static_cast<float>(out_w);
  g.shift_y = 0.5f * g.scale_y - 0.5f;
  g.shift_x = 0.5f * g.scale_x - 0.5f;
  g.half_h = 0.5f * static_cast<float>(out_h);
  g.half_w = 0.5f * static_cast<float>(out_w);
  g.out_h_f = static_cast<float>(out_h);
  g.out_w_f = static_cast<float>(out_w);
  g.last_row = static_cast<float>(crop_h - 1);
  g.last_col = static_cast<float>(crop_w - 1);
  return g;
}

/// One sample's drawn parameters, as the math consumes them.
struct SampleParams {
  int top, left;       ///< crop offset in the source
  float cos_a, sin_a;  ///< of the rotation angle (counter-clockwise on the displayed image)
  int flip;            ///< 1: mirror the output horizontally
};

TANDEM_HD float min_f(float a, float b) { return a < b ? a : b; }
TANDEM_HD float max_f(float a, float b) { return a > b ? a : b; }

/// a * b + c with one rounding: one instruction on the GPU and on an x86 CPU with FMA (the CPU
/// reference is built for those as a separate clone), std::fma's exact result elsewhere.
TANDEM_HD float fmadd(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// Index i of a row or column of length n, with PyTorch's "reflect" padding (edge not
/// repeated): -1 -> 1, n -> n - 2. Requires n > the padding.
TANDEM_HD int reflect(int i, int n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * n - 2 - i;
  return i;
}

/// Where output pixel (i, j) reads the source: the composition
///   crop (top, left, crop_h x crop_w)
///   -> resize to out_h x out_w, bilinear, align_corners=false (PyTorch's upsample_bilinear2d)
///   -> rotate about the centre, same size, nearest neighbour in the resized grid, fill 0
///      (torchvision's RandomRotation default)
///   -> optional horizontal flip
/// evaluated in one step: the rotation picks a resized pixel, whose value is a bilinear read of
/// the crop. The same for every channel, so it is computed once per pixel. The resize's part
/// depends on the resized row alone (for the rows) and column alone (for the columns): the C++
/// reference and the kernel's staged window tabulate it (AxisTap), the kernel's texture gathers
/// compute it per pixel (GatherTap), the same values.

/// One axis of the resize: resized index i reads source indices i0 and i1 (= i0 or i0 + 1)
/// with weight l on i1 (one_minus_l = 1 - l on i0).
struct AxisTap {
  int i0, i1;
  float l, one_minus_l;
};

/// Where resized index `i` reads along an axis, in the crop's source coordinates:
/// i * scale + shift with one rounding (PyTorch's (i + 0.5) * scale - 0.5 rounds three times),
/// clamped to [0, last], `last` the crop's last index. The clamp at `last` is where PyTorch reads
/// the crop's last pixel twice, with weights 1 - l and l; here it gets weight 1 and its neighbour
/// weight 0 — the same value, exactly (1 * a + 0 * b = a), where PyTorch's rounds. The kernel's
/// texture gathers always fetch i0 and i0 + 1 (the neighbour may lie outside the crop, even the
/// image, where the texture clamps: finite, times 0); axis_tap's i1 stays i0 there, so the reads
/// from memory stay inside the crop.
TANDEM_HD float source_coordinate(float i, float scale, float shift, float last) {
  return min_f(max_f(fmadd(i, scale, shift), 0.0f), last);
}

/// floor(x) as an int, for |x| < 2^22 (image coordinates). On the GPU two full-rate
/// instructions instead of a conversion (F2I runs at a quarter of the add rate on sm_90): x plus
/// 1.5 * 2^23, rounded toward minus infinity, lands where floats are one apart, on
/// 1.5 * 2^23 + floor(x), whose bit pattern is 1.5 * 2^23's plus floor(x).
TANDEM_HD int floor_to_int(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_int(__fadd_rd(x, 12582912.0f)) - 0x4B400000;
#else
  return static_cast<int>(std::floor(x));
#endif
}

/// floor(x) as a float, for |x| < 2^22: on the GPU floor_to_int's add with 1.5 * 2^23
/// subtracted back (exact), no conversion.
TANDEM_HD float floor_f(float x) {
#ifdef __CUDA_ARCH__
  return __fadd_rd(x, 12582912.0f) - 12582912.0f;
#else
  return std::floor(x);
#endif
}

/// Resized index `i` along an axis (scale, shift: Geometry's), the crop's last index `last`:
/// its source taps with i0 counted from the crop's start, in floats (integers, exact) — what the
/// kernel's texture gathers compute per pixel.
struct GatherTap {
  float i0, l, one_minus_l;
};

TANDEM_HD GatherTap gather_tap(float i, float scale, float shift, float last) {
  const float s = source_coordinate(i, scale, shift, last);
  const float i0 = floor_f(s);
  const float l = s - i0;
  return {i0, l, 1.0f - l};
}

/// The same taps as source indices, for a crop of `crop` pixels that starts at `offset` in the
/// source (the C++ reference's and the staged window's tables).
TANDEM_HD AxisTap axis_tap(int i, float scale, float shift, int crop, int offset) {
  const GatherTap t = gather_tap(static_cast<float>(i), scale, shift, static_cast<float>(crop - 1));
  const int i0 = static_cast<int>(t.i0);
  return {offset + i0, offset + (i0 < crop - 1 ? i0 + 1 : i0), t.l, t.one_minus_l};
}

/// The resized pixel an output pixel's centre (u, v) (from the image centre, u already
/// mirrored when the sample is flipped) rotates back to; inside == false: outside the image.
struct Resized {
  bool inside;
  int ci, ri;
};

/// The inverse rotation of (u, v), measured from the resized grid's top-left corner, whose pixel
/// k spans [k, k + 1): fc = qu + out_w / 2.
struct Rotated {
  float fc, fr;
};

/// Where a row's point at u = 0 rotates back to, in grid coordinates: the parts of the inverse
/// rotation that depend on the row (v) alone, computed once per row; the rotation of (u, v) adds
/// (cos_a * u, sin_a * u) to them.
struct RowTerms {
  float fc0, fr0;
};

TANDEM_HD RowTerms row_terms(const Geometry& g, float cos_a, float sin_a, float v) {
  return {-(sin_a * v) + g.half_w, cos_a * v + g.half_h};
}

TANDEM_HD Rotated rotate_to_grid(float cos_a, float sin_a, float u, const RowTerms& row) {
  return {fmadd(cos_a, u, row.fc0), fmadd(sin_a, u, row.fr0)};
}

TANDEM_HD Rotated rotate_to_grid(const Geometry& g, float cos_a, float sin_a, float u, float v) {
  return rotate_to_grid(cos_a, sin_a, u, row_terms(g, cos_a, sin_a, v));
}

TANDEM_HD Resized rotate_back(const Geometry& g, float cos_a, float sin_a, float u,
                              const RowTerms& row) {
  // Nearest (round half up) in the resized grid.
  const Rotated q = rotate_to_grid(cos_a, sin_a, u, row);
  Resized r{false, floor_to_int(q.fc), floor_to_int(q.fr)};
  r.inside = static_cast<unsigned>(r.ci) < static_cast<unsigned>(g.out_w) &&
             static_cast<unsigned>(r.ri) < static_cast<unsigned>(g.out_h);
  return r;
}

TANDEM_HD Resized rotate_back(const Geometry& g, float cos_a, float sin_a, float u, float v) {
  return rotate_back(g, cos_a, sin_a, u, row_terms(g, cos_a, sin_a, v));
}

struct Tap {
  bool inside;   ///< false: the rotation looked outside the image (fill 0)
  AxisTap x, y;  ///< source columns and rows with their bilinear weights
};

/// Pixel `index` of a row or column of `size`: its centre relative to the image's centre.
TANDEM_HD float centre_offset(int index, int size) {
  return (static_cast<float>(index) + 0.5f) - 0.5f * static_cast<float>(size);
}

/// Where output pixel (i, j) reads the source: its centre (u, v) from the image centre (before
/// the flip) is (centre_offset(j, out_w), centre_offset(i, out_h)); the kernel computes those
/// once per tile row and column, the C++ reference once per row, with the resize's taps of
/// every resized row and column tabulated (the same axis_tap values).
TANDEM_HD Tap locate_centred(const Geometry& g, const SampleParams& p, float u, float v) {
  Tap t{false, {0, 0, 0.0f, 0.0f}, {0, 0, 0.0f, 0.0f}};
  const Resized r = rotate_back(g, p.cos_a, p.sin_a, p.flip ? -u : u, v);
  if (!r.inside) return t;
  t.inside = true;
  t.x = axis_tap(r.ci, g.scale_x, g.shift_x, g.crop_w, p.left);
  t.y = axis_tap(r.ri, g.scale_y, g.shift_y, g.crop_h, p.top);
  return t;
}

/// A byte as a float, exactly. On the GPU, 2^23 + v assembled as a float's bit pattern, minus
/// 2^23: a bitwise or and an add instead of an integer-to-float conversion, which runs at a
/// sixteenth of the add rate on sm_90 and was a bottleneck of the sampling pass.
TANDEM_HD float byte_to_float(uint8_t v) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(0x4B000000u | v) - 8388608.0f;
#else
  return static_cast<float>(v);
#endif
}

/// A byte as sampling reads it: v / 255, correctly rounded — what an 8-bit normalized-float
/// texture returns, so the kernel's texture gathers use their results as they come (multiplying
/// every texel back by 255 was 12 instructions of each sampled pixel's ~87); normalize's
/// constants (normalization()) bring the 255 back. One quotient estimate and one correction,
/// computed the same way on both sides; for every byte it is the correctly rounded quotient
/// (AugmentTest.SamplingReadsEveryByteAsItsCorrectlyRoundedQuotientBy255; the texture unit's
/// value: AugmentGpuTest.TextureGathersReadEveryByteExactly).
constexpr float kInv255 = 1.0f / 255.0f;
TANDEM_HD float unit_byte(uint8_t v) {
  const float f = byte_to_float(v);
  const float q = f * kInv255;
  return fmadd(fmadd(-255.0f, q, f), kInv255, q);
}

/// Bilinear interpolation of four source values: a b on the top row, c d on the bottom one.
TANDEM_HD float bilerp(float a, float b, float c, float d, const AxisTap& x, const AxisTap& y) {
  const float top_row = fmadd(x.l, b, x.one_minus_l * a);
  const float bottom_row = fmadd(x.l, d, x.one_minus_l * c);
  return fmadd(y.l, bottom_row, y.one_minus_l * top_row);
}

/// The value, before blur and normalize, of a located pixel in one channel `plane` (in_h x in_w
/// uint8, row-major; fewer than 2^31 bytes), in units of 1/255: unit(v) is unit_byte(v), computed
/// or (the C++ reference) looked up in a table of unit_byte's 256 values — the same floats.
template <typename Unit>
TANDEM_HD float read(const uint8_t* plane, int in_w, const Tap& t, Unit unit) {
  if (!t.inside) return 0.0f;
  const uint8_t* top = plane + t.y.i0 * in_w;
  const uint8_t* bottom = plane + t.y.i1 * in_w;
  return bilerp(unit(top[t.x.i0]), unit(top[t.x.i1]), unit(bottom[t.x.i0]), unit(bottom[t.x.i1]),
                t.x, t.y);
}

/// A channel's normalize constants for sampled values in units of 1/255: (255 v - mean) / std
/// is v * (255 / std) - mean / std; each constant rounded to float once, on the host, for both
/// paths.
struct Normalization {
  float scale;  ///< 255 / std
  float shift;  ///< -mean / std
};

inline Normalization normalization(double mean, double std) {
  return {static_cast<float>(255.0 / std), static_cast<float>(-mean / std)};
}

/// Normalize: one multiply-add per pixel (no IEEE division; both paths use this, so they agree
/// to the bit).
TANDEM_HD float normalize(float v, const Normalization& n) { return fmadd(v, n.scale, n.shift); }

/// One tap-ordered pass of the separable blur: sum_k w[k] * x(k), k ascending, one fused
/// multiply-add per tap, so every implementation rounds the same way.
template <typename Read>
TANDEM_HD float blur_taps(const float* w, int taps, Read read) {
  float acc = 0.0f;
  for (int k = 0; k < taps; ++k) acc = fmadd(w[k], read(k), acc);
  return acc;
}

}  // namespace tandem::augment_math
