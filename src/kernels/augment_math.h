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

/// The value, before blur and normalize, of output pixel (i, j) of one channel: the composition
///   crop (top, left, crop_h x crop_w)
///   -> resize to out_h x out_w, bilinear, align_corners=false (PyTorch's upsample_bilinear2d)
///   -> rotate about the centre, same size, nearest neighbour in the resized grid, fill 0
///      (torchvision's RandomRotation default)
///   -> optional horizontal flip
/// evaluated in one step: the rotation picks a resized pixel, whose value is a bilinear read of
/// the crop. `plane` is one channel of the source, in_h x in_w uint8, row-major.
TANDEM_HD float sample(const uint8_t* plane, const Geometry& g, const SampleParams& p, int i,
                       int j) {
  float u = (static_cast<float>(j) + 0.5f) - 0.5f * static_cast<float>(g.out_w);
  const float v = (static_cast<float>(i) + 0.5f) - 0.5f * static_cast<float>(g.out_h);
  if (p.flip) u = -u;
  // Inverse rotation: where in the unrotated (resized) image this output pixel comes from.
  const float qu = p.cos_a * u - p.sin_a * v;
  const float qv = p.sin_a * u + p.cos_a * v;
  const float col = qu + 0.5f * static_cast<float>(g.out_w) - 0.5f;
  const float row = qv + 0.5f * static_cast<float>(g.out_h) - 0.5f;
  const float fc = col + 0.5f, fr = row + 0.5f;  // nearest: round half up
  if (fc < 0.0f || fr < 0.0f) return 0.0f;
  const int ci = static_cast<int>(fc), ri = static_cast<int>(fr);
  if (ci >= g.out_w || ri >= g.out_h) return 0.0f;
  // Bilinear read of the crop at resized pixel (ri, ci).
  const float scale_x = static_cast<float>(g.crop_w) / static_cast<float>(g.out_w);
  const float scale_y = static_cast<float>(g.crop_h) / static_cast<float>(g.out_h);
  const float sx = max_f((static_cast<float>(ci) + 0.5f) * scale_x - 0.5f, 0.0f);
  const float sy = max_f((static_cast<float>(ri) + 0.5f) * scale_y - 0.5f, 0.0f);
  const int x0 = static_cast<int>(sx), y0 = static_cast<int>(sy);
  const int x1 = min_i(x0 + 1, g.crop_w - 1), y1 = min_i(y0 + 1, g.crop_h - 1);
  const float lx = sx - static_cast<float>(x0), ly = sy - static_cast<float>(y0);
  const uint8_t* r0 = plane + static_cast<int64_t>(p.top + y0) * g.in_w + p.left;
  const uint8_t* r1 = plane + static_cast<int64_t>(p.top + y1) * g.in_w + p.left;
  const float top_row = (1.0f - lx) * static_cast<float>(r0[x0]) + lx * static_cast<float>(r0[x1]);
  const float bottom_row =
      (1.0f - lx) * static_cast<float>(r1[x0]) + lx * static_cast<float>(r1[x1]);
  return (1.0f - ly) * top_row + ly * bottom_row;
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
