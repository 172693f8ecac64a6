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

/// Sizes shared by every sample of a batch.
struct Geometry {
  int in_h, in_w;      ///< source image
  int crop_h, crop_w;  ///< random crop
  int out_h, out_w;    ///< after resize (and rotation, which keeps the size)
};

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
  int64_t row0, row1;   ///< source row offsets (row * in_w), top and bottom
  int x0, x1;           ///< source columns, left and right
  float lx, ly;         ///< bilinear weights of the right column and the bottom row
};

TANDEM_HD Tap locate(const Geometry& g, const SampleParams& p, int i, int j) {
  Tap t{false, 0, 0, 0, 0, 0.0f, 0.0f};
  float u = (static_cast<float>(j) + 0.5f) - 0.5f * static_cast<float>(g.out_w);
  const float v = (static_cast<float>(i) + 0.5f) - 0.5f * static_cast<float>(g.out_h);
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
  const float scale_x = static_cast<float>(g.crop_w) / static_cast<float>(g.out_w);
  const float scale_y = static_cast<float>(g.crop_h) / static_cast<float>(g.out_h);
  const float sx = max_f((static_cast<float>(ci) + 0.5f) * scale_x - 0.5f, 0.0f);
  const float sy = max_f((static_cast<float>(ri) + 0.5f) * scale_y - 0.5f, 0.0f);
  const int x0 = static_cast<int>(sx), y0 = static_cast<int>(sy);
  t.inside = true;
  t.x0 = p.left + x0;
  t.x1 = p.left + min_i(x0 + 1, g.crop_w - 1);
  t.row0 = static_cast<int64_t>(p.top + y0) * g.in_w;
  t.row1 = static_cast<int64_t>(p.top + min_i(y0 + 1, g.crop_h - 1)) * g.in_w;
  t.lx = sx - static_cast<float>(x0);
  t.ly = sy - static_cast<float>(y0);
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

/// The value, before blur and normalize, of a located pixel in one channel `plane` (in_h x in_w
/// uint8, row-major).
TANDEM_HD float read(const uint8_t* plane, const Tap& t) {
  if (!t.inside) return 0.0f;
  const float top_row = (1.0f - t.lx) * byte_to_float(plane[t.row0 + t.x0]) +
                        t.lx * byte_to_float(plane[t.row0 + t.x1]);
  const float bottom_row = (1.0f - t.lx) * byte_to_float(plane[t.row1 + t.x0]) +
                           t.lx * byte_to_float(plane[t.row1 + t.x1]);
  return (1.0f - t.ly) * top_row + t.ly * bottom_row;
}

/// Normalize with the reciprocal of std, computed once per channel on the host: a multiply per
/// pixel instead of an IEEE division (both paths use this, so they still agree to the bit).
TANDEM_HD float normalize(float v, float mean, float inv_std) { return (v - mean) * inv_std; }

/// locate + read: output pixel (i, j) of one channel, before blur and normalize.
TANDEM_HD float sample(const uint8_t* plane, const Geometry& g, const SampleParams& p, int i,
                       int j) {
  return read(plane, locate(g, p, i, j));
}

/// One tap-ordered pass of the separable blur: sum_k w[k] * x(k), k ascending, no fused
/// multiply-add, so every implementation adds in the same order.
template <typename Read>
TANDEM_HD float blur_taps(const float* w, int taps, Read read) {
  float acc = 0.0f;
  for (int k = 0; k < taps; ++k) acc = acc + w[k] * read(k);
  return acc;
}

}  // namespace tandem::augment_math
