// The per-pixel arithmetic of the fused augmentation, shared verbatim by the CPU reference
// (augment.cpp) and the CUDA kernel (augment.cu): the same code on both sides is what makes CPU
// and GPU outputs agree to the bit (the .cu is compiled with -fmad=false so nvcc does not fuse
// the multiply-adds the CPU does separately).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem::augment_math {

/// Sizes shared by every sample of a batch (make_geometry fills the scales).
struct Geometry {
  int in_h, in_w;      ///< source image
  int crop_h, crop_w;  ///< random crop
  int out_h, out_w;    ///< after resize (and rotation, which keeps the size)
  float scale_y, scale_x;  ///< crop / out, the resize's source step per output pixel
};

inline Geometry make_geometry(int in_h, int in_w, int crop_h, int crop_w, int out_h, int out_w) {
  return {in_h,  in_w,  crop_h, crop_w, out_h, out_w,
          static_cast<float>(crop_h) / static_cast<float>(out_h),
          static_cast<float>(crop_w) / static_cast<float>(out_w)};
}

/// One sample's drawn parameters, as the math consumes them.
struct SampleParams {
  int top, left;     ///< crop offset in the source
  float cos_a, sin_a;  ///< of the rotation angle (counter-clockwise on the displayed image)
  int flip;          ///< 1: mirror the output horizontally
};

TANDEM_HD float min_f(float a, float b) { return a < b ? a : b; }
TANDEM_HD float max_f(float a, float b) { return a > b ? a : b; }
TANDEM_HD int min_i(int a, int b) { return a < b ? a : b; }

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
/// the crop. The same for every channel, so it is computed once per pixel.
struct Tap {
  bool inside;          ///< false: the rotation looked outside the image (fill 0)
  int row0, row1;       ///< source rows, top and bottom
  int x0, x1;           ///< source columns, left and right
  float lx, ly;         ///< bilinear weights of the right column and the bottom row
};

/// Pixel `index` of a row or column of `size`: its centre relative to the image's centre.
TANDEM_HD float centre_offset(int index, int size) {
  return (static_cast<float>(index) + 0.5f) - 0.5f * static_cast<float>(size);
}

/// locate() for the output pixel whose centre is (u, v) from the image centre (before the
/// flip), as centre_offset gives them: the kernel computes those once per tile row and column.
TANDEM_HD Tap locate_centred(const Geometry& g, const SampleParams& p, float u, float v) {
  Tap t{false, 0, 0, 0, 0, 0.0f, 0.0f};
  if (p.flip) u = -u;
  // Inverse rotation: where in the unrotated (resized) image this output pixel comes from.
  const float qu = p.cos_a * u - p.sin_a * v;
  const float qv = p.sin_a * u + p.cos_a * v;
  const float col = qu + 0.5f * static_cast<float>(g.out_w) - 0.5f;
  const float row = qv + 0.5f * static_cast<float>(g.out_h) - 0.5f;
  const float fc = col + 0.5f, fr = row + 0.5f;  // nearest: round half up
  if (fc < 0.0f || fr < 0.0f) return t;
  const int ci = static_cast<int>(fc), ri = static_cast<int>(fr);
  if (ci >= g.out_w || ri >= g.out_h) return t;
  // Bilinear read of the crop at resized pixel (ri, ci).
  const float sx = max_f((static_cast<float>(ci) + 0.5f) * g.scale_x - 0.5f, 0.0f);
  const float sy = max_f((static_cast<float>(ri) + 0.5f) * g.scale_y - 0.5f, 0.0f);
  const int x0 = static_cast<int>(sx), y0 = static_cast<int>(sy);
  t.inside = true;
  t.x0 = p.left + x0;
  t.x1 = p.left + min_i(x0 + 1, g.crop_w - 1);
  t.row0 = p.top + y0;
  t.row1 = p.top + min_i(y0 + 1, g.crop_h - 1);
  t.lx = sx - static_cast<float>(x0);
  t.ly = sy - static_cast<float>(y0);
  return t;
}

TANDEM_HD Tap locate(const Geometry& g, const SampleParams& p, int i, int j) {
  return locate_centred(g, p, centre_offset(j, g.out_w), centre_offset(i, g.out_h));
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

/// Bilinear interpolation of four source values: a b on the top row, c d on the bottom one.
TANDEM_HD float bilerp(float a, float b, float c, float d, float lx, float ly) {
  const float top_row = (1.0f - lx) * a + lx * b;
  const float bottom_row = (1.0f - lx) * c + lx * d;
  return (1.0f - ly) * top_row + ly * bottom_row;
}

/// The value, before blur and normalize, of a located pixel in one channel `plane` (in_h x in_w
/// uint8, row-major; fewer than 2^31 bytes).
TANDEM_HD float read(const uint8_t* plane, int in_w, const Tap& t) {
  if (!t.inside) return 0.0f;
  const uint8_t* top = plane + t.row0 * in_w;
  const uint8_t* bottom = plane + t.row1 * in_w;
  return bilerp(byte_to_float(top[t.x0]), byte_to_float(top[t.x1]), byte_to_float(bottom[t.x0]),
                byte_to_float(bottom[t.x1]), t.lx, t.ly);
}

/// Normalize with the reciprocal of std, computed once per channel on the host: a multiply per
/// pixel instead of an IEEE division (both paths use this, so they still agree to the bit).
TANDEM_HD float normalize(float v, float mean, float inv_std) { return (v - mean) * inv_std; }

/// One tap-ordered pass of the separable blur: sum_k w[k] * x(k), k ascending, no fused
/// multiply-add, so every implementation adds in the same order.
template <typename Read>
TANDEM_HD float blur_taps(const float* w, int taps, Read read) {
  float acc = 0.0f;
  for (int k = 0; k < taps; ++k) acc = acc + w[k] * read(k);
  return acc;
}

}  // namespace tandem::augment_math
