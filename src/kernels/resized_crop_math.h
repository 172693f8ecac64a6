// The arithmetic of the resized crop (resized_crop.h), shared verbatim by the CUDA kernels
// (resized_crop.cu) and the C++ reference (resized_crop.cpp): the same code on both sides is what
// makes their outputs agree to the bit. Multiply-adds are written as augment_math::fmadd (one
// rounding on both sides); nothing else may fuse (resized_crop.cu is compiled with -fmad=false,
// resized_crop.cpp with -ffp-contract=off).
#pragma once

#include <cstdint>
#ifndef __CUDA_ARCH__
#include <cmath>
#endif

#include "augment_math.h"
#include "tandem/detail/sample_rng.h"

namespace tandem::crop_math {

using augment_math::fmadd;

/// Box fields, in this order, per sample (an int32 row of kBoxFields). kSubY / kSubX: the box's
/// sub-pixel part on each axis, in eighths of a source pixel — start (sub & 7) after kTop /
/// kLeft and length (sub >> 3) beyond kHeight / kWidth — for a box cut from a DCT-scaled decode
/// (1/2, 1/4, 1/8 of the full-resolution pixels it was drawn in); 0 for a box in whole pixels.
enum BoxField {
  kTop,
  kLeft,
  kHeight,
  kWidth,
  kResizedH,
  kResizedW,
  kOffsetY,
  kOffsetX,
  kFlip,
  kSubY,
  kSubX
};
constexpr int kBoxFields = 11;

/// What the draw needs (ResizedCropSpec without the normalization).
struct DrawSpec {
  int random;  ///< 1: RandomResizedCrop; 0: Resize(resize_size) + CenterCrop
  int out_h, out_w;
  double scale_min, scale_max;          ///< of the source's area
  double log_ratio_min, log_ratio_max;  ///< log of width / height
  double ratio_min, ratio_max;
  int resize_size;
  double hflip_probability;
};

/// The box of one sample of (height h, width w), drawn from (seed, offset, index): torchvision's
/// RandomResizedCrop.get_params (ten tries of a random area and log-uniform aspect ratio, then
/// the whole image clamped to the ratio range, centred), or Resize(resize_size) + CenterCrop's
/// geometry (the short side to resize_size, the long one int(resize_size * long / short); the
/// crop at round((resized - out) / 2), half to even). Computed in double; host and device agree
/// except where their exp / log differ in a double's last bit at a rounding boundary.
TANDEM_HD void draw_box(const DrawSpec& s, int h, int w, uint64_t seed, uint64_t offset,
                        uint64_t index, int32_t* box) {
  SampleRng rng(seed ^ (offset * 0xD1B54A32D192ED03ull), index);
  auto uniform = [&] { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; };  // [0, 1)
  auto below = [&](int n) { return static_cast<int32_t>(uniform() * static_cast<double>(n)); };
  int top = 0, left = 0, ch = h, cw = w, rh = s.out_h, rw = s.out_w, y0 = 0, x0 = 0;
  if (s.random) {
    const double area = static_cast<double>(h) * static_cast<double>(w);
    bool found = false;
    for (int attempt = 0; attempt < 10 && !found; ++attempt) {
      const double target = area * (s.scale_min + uniform() * (s.scale_max - s.scale_min));
      const double aspect =
          ::exp(s.log_ratio_min + uniform() * (s.log_ratio_max - s.log_ratio_min));
      const int tw = static_cast<int>(::rint(::sqrt(target * aspect)));
      const int th = static_cast<int>(::rint(::sqrt(target / aspect)));
      if (tw > 0 && tw <= w && th > 0 && th <= h) {
        ch = th;
        cw = tw;
        top = below(h - th + 1);
        left = below(w - tw + 1);
        found = true;
      }
    }
    if (!found) {  // torchvision's fallback: the whole image, clamped to the ratio range
      const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
      if (in_ratio < s.ratio_min) {
        cw = w;
        ch = static_cast<int>(::rint(static_cast<double>(w) / s.ratio_min));
      } else if (in_ratio > s.ratio_max) {
        ch = h;
        cw = static_cast<int>(::rint(static_cast<double>(h) * s.ratio_max));
      }
      top = (h - ch) / 2;
      left = (w - cw) / 2;
    }
  } else {
    const int short_side = h < w ? h : w, long_side = h < w ? w : h;
    const int resized_long =
        static_cast<int>(static_cast<double>(s.resize_size) * static_cast<double>(long_side) /
                         static_cast<double>(short_side));
    rh = h <= w ? s.resize_size : resized_long;
    rw = h <= w ? resized_long : s.resize_size;
    y0 = static_cast<int>(::rint(static_cast<double>(rh - s.out_h) / 2.0));
    x0 = static_cast<int>(::rint(static_cast<double>(rw - s.out_w) / 2.0));
  }
  const int flip = uniform() < s.hflip_probability ? 1 : 0;
  box[kTop] = top;
  box[kLeft] = left;
  box[kHeight] = ch;
  box[kWidth] = cw;
  box[kResizedH] = rh;
  box[kResizedW] = rw;
  box[kOffsetY] = y0;
  box[kOffsetX] = x0;
  box[kFlip] = flip;
  box[kSubY] = 0;
  box[kSubX] = 0;
}

/// One axis of an antialiased bilinear resize (PIL's and ATen's _upsample_bilinear2d_aa rule,
/// align_corners = false): resized index i of a window of `in` source pixels resized to `out`
/// reads source pixels first .. first + count - 1 of the window, with triangle weights
/// widened by the scale when shrinking, normalized to sum 1 (weight(k) / total).
struct AxisWindow {
  int first, count;
  float centre, inv_scale, total;
};

TANDEM_HD float triangle(float x) {
  const float a = x < 0.0f ? -x : x;
  return a < 1.0f ? 1.0f - a : 0.0f;
}

/// The unnormalized weight of tap k (source pixel first + k).
TANDEM_HD float weight_raw(const AxisWindow& a, int k) {
  return triangle((static_cast<float>(k + a.first) - a.centre + 0.5f) * a.inv_scale);
}

/// `sub`: the window's sub-pixel start and extra length in eighths (kSubY / kSubX); with 0 the
/// arithmetic is exactly the whole-pixel window's (0.0f added, the same scale).
TANDEM_HD AxisWindow axis_window(int i, int in, int out, int sub = 0) {
  const float start = static_cast<float>(sub & 7) * 0.125f;
  const float length = static_cast<float>(in) + static_cast<float>(sub >> 3) * 0.125f;
  const float scale = length / static_cast<float>(out);
  const float support = scale >= 1.0f ? scale : 1.0f;
  AxisWindow a;
  a.centre = start + scale * (static_cast<float>(i) + 0.5f);
  a.inv_scale = scale >= 1.0f ? 1.0f / scale : 1.0f;
  // The taps stay inside the source pixels the box touches: [0, ceil(start + length)).
  const int limit =
      sub == 0 ? in : static_cast<int>(-augment_math::floor_f(-(start + length)));  // ceil
  int first = static_cast<int>(a.centre - support + 0.5f);
  if (first < 0) first = 0;
  int end = static_cast<int>(a.centre + support + 0.5f);
  if (end > limit) end = limit;
  a.first = first;
  a.count = end - first;
  float total = 0.0f;
  for (int k = 0; k < a.count; ++k) total += weight_raw(a, k);
  a.total = total;
  return a;
}

TANDEM_HD float weight(const AxisWindow& a, int k) { return weight_raw(a, k) / a.total; }

/// out = (pixel - mean) / std as one multiply-add: scale = 1 / std, shift = -mean / std.
struct Normalization {
  float scale, shift;
};
inline Normalization normalization(double mean, double std) {
  return {static_cast<float>(1.0 / std), static_cast<float>(-mean / std)};
}
TANDEM_HD float normalize(float pixel, const Normalization& n) {
  return fmadd(pixel, n.scale, n.shift);
}

/// Rounds a resampled value to a pixel, as the uint8 resize of torchvision does: 0..255.
TANDEM_HD float to_pixel(float v) {
  const float r = augment_math::floor_f(v + 0.5f);
  return r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r);
}

/// Where a sample's pixels are: pixel (y, x) of channel c at y * row + x * pixel + c * channel.
/// (h, w, C) interleaved (the CPU decoders'): row w * C, pixel C, channel 1; (C, h, w) planar
/// (nvJPEG's): row w, pixel 1, channel h * w.
struct Layout {
  int64_t row, pixel, channel;
};
TANDEM_HD Layout layout_of(bool planar, int h, int w, int C) {
  return planar ? Layout{w, 1, static_cast<int64_t>(h) * w}
                : Layout{static_cast<int64_t>(w) * C, C, 1};
}

/// Output pixel (y, x) of channel c of the sample at `image` laid out as `l`; rows / cols the
/// axis windows of resized index y0 + y and x0 + x (flip applied by the caller), relative to the
/// box's top / left. Sum over rows of weight * (sum over columns of weight * pixel), in tap
/// order, each product-sum one fmadd.
TANDEM_HD float resample(const uint8_t* image, const Layout& l, int c, int top, int left,
                         const AxisWindow& rows, const AxisWindow& cols) {
  float acc = 0.0f;
  for (int ky = 0; ky < rows.count; ++ky) {
    const uint8_t* line =
        image + (top + rows.first + ky) * l.row + (left + cols.first) * l.pixel + c * l.channel;
    float row = 0.0f;
    for (int kx = 0; kx < cols.count; ++kx)
      row = fmadd(weight(cols, kx), static_cast<float>(line[kx * l.pixel]), row);
    acc = fmadd(weight(rows, ky), row, acc);
  }
  return to_pixel(acc);
}

/// resample() of channels 0 .. channels - 1 (at most kMax) into out[], each tap's weights
/// computed once for all of them instead of once a channel: each channel's sum is resample()'s
/// (the same fmadds in the same order), so the values are its values bit for bit.
template <int kMax>
TANDEM_HD void resample_channels(const uint8_t* image, const Layout& l, int channels, int top,
                                 int left, const AxisWindow& rows, const AxisWindow& cols,
                                 float* out) {
  float acc[kMax];
  TANDEM_UNROLL
  for (int c = 0; c < kMax; ++c) acc[c] = 0.0f;
  for (int ky = 0; ky < rows.count; ++ky) {
    const uint8_t* line = image + (top + rows.first + ky) * l.row + (left + cols.first) * l.pixel;
    float row[kMax];
    TANDEM_UNROLL
    for (int c = 0; c < kMax; ++c) row[c] = 0.0f;
    for (int kx = 0; kx < cols.count; ++kx) {
      const float w = weight(cols, kx);
      const uint8_t* pixel = line + kx * l.pixel;
      TANDEM_UNROLL
      for (int c = 0; c < kMax; ++c)
        if (c < channels) row[c] = fmadd(w, static_cast<float>(pixel[c * l.channel]), row[c]);
    }
    const float w = weight(rows, ky);
    TANDEM_UNROLL
    for (int c = 0; c < kMax; ++c)
      if (c < channels) acc[c] = fmadd(w, row[c], acc[c]);
  }
  TANDEM_UNROLL
  for (int c = 0; c < kMax; ++c)
    if (c < channels) out[c] = to_pixel(acc[c]);
}

}  // namespace tandem::crop_math
