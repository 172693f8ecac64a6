// One sample's augmentation parameters as a pure function of (seed, offset, index), shared by the
// CUDA draw kernel (augment.cu: one thread per sample, the whole batch in one launch) and the
// host (the CPU device and cpu_aug's loader workers). Counter-based: no state to carry between
// draws, so a draw inside a replayed CUDA graph only needs a fresh offset per replay, which
// PyTorch's graph-safe Philox bookkeeping provides (augment.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "augment_math.h"
#include "tandem/detail/sample_rng.h"

namespace tandem::augment_math {

/// What the draw needs to know (AugmentSpec without the parts the draw does not use).
struct DrawSpec {
  int in_h, in_w, crop_h, crop_w;
  double max_rotation_deg, sigma_min, sigma_max, hflip_probability;
  int taps;  ///< blur kernel size, odd
};

/// One sample's parameters; the blur weights go to a separate array of `taps` floats.
struct Drawn {
  int32_t top, left, flip;
  float angle_deg, cos_a, sin_a, sigma;
};

/// Draws sample `index` of the draw keyed by (seed, offset). Everything is computed in double and
/// rounded once, so host and device agree except where the two sides' cos/sin/exp differ in the
/// last bit of a double (the augmentation itself is exact given these parameters).
TANDEM_HD Drawn draw_sample(const DrawSpec& s, uint64_t seed, uint64_t offset, uint64_t index,
                            float* weights) {
  // Distinct offsets give distinct streams: multiplying by an odd constant is a bijection.
  SampleRng rng(seed ^ (offset * 0xD1B54A32D192ED03ull), index);
  auto uniform = [&] { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; };  // [0, 1)
  auto below = [&](int n) { return static_cast<int32_t>(uniform() * static_cast<double>(n)); };
  Drawn d;
  d.top = below(s.in_h - s.crop_h + 1);
  d.left = below(s.in_w - s.crop_w + 1);
  d.angle_deg = static_cast<float>((uniform() * 2.0 - 1.0) * s.max_rotation_deg);
  d.sigma = static_cast<float>(s.sigma_min + uniform() * (s.sigma_max - s.sigma_min));
  d.flip = uniform() < s.hflip_probability ? 1 : 0;
  const double radians = static_cast<double>(d.angle_deg) * (3.14159265358979323846 / 180.0);
  d.cos_a = static_cast<float>(::cos(radians));
  d.sin_a = static_cast<float>(::sin(radians));
  // Normalized Gaussian taps at x = -(taps-1)/2 .. (taps-1)/2: exp(-x^2 / (2 sigma^2)) / sum.
  const double sigma = static_cast<double>(d.sigma);
  const int r = s.taps / 2;
  double sum = 0.0;
  for (int k = 0; k < s.taps; ++k) {
    const double x = static_cast<double>(k - r) / sigma;
    sum += ::exp(-0.5 * x * x);
  }
  for (int k = 0; k < s.taps; ++k) {
    const double x = static_cast<double>(k - r) / sigma;
    weights[k] = static_cast<float>(::exp(-0.5 * x * x) / sum);
  }
  return d;
}

}  // namespace tandem::augment_math
