// A tiny, fast, counter-based random source for synthetic samples: sample i of a dataset is a
// pure function of (seed, i), whichever worker thread makes it and in whatever order.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define TANDEM_RNG_HD __host__ __device__
#else
#define TANDEM_RNG_HD
#endif

namespace tandem {

/// SplitMix64 (Steele, Lea, Flood 2014): one add and three xor-shift-multiplies per 64 bits;
/// passes BigCrush, and seeding from (seed, index) needs no warm-up. Usable in CUDA kernels too
/// (the augmentation draws its per-sample parameters with it on either side).
class SampleRng {
 public:
  TANDEM_RNG_HD SampleRng(uint64_t seed, uint64_t index)
      : state_(mix(seed ^ mix(index + 0x9E3779B97F4A7C15ull))) {}

  TANDEM_RNG_HD uint64_t next() { return mix(state_ += 0x9E3779B97F4A7C15ull); }

  /// n uniform random bytes.
  void fill_bytes(uint8_t* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t r = next();
      std::memcpy(out + i, &r, 8);
    }
    if (i < n) {
      const uint64_t r = next();
      std::memcpy(out + i, &r, static_cast<size_t>(n - i));
    }
  }

  /// n integers uniform in [0, bound): 32 random bits each, scaled by multiply-shift
  /// (bias below 2^-32 * bound: irrelevant for synthetic labels).
  void fill_below(int64_t* out, int64_t n, uint32_t bound) {
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      const uint64_t r = next();
      out[i] = static_cast<int64_t>(((r & 0xFFFFFFFFull) * bound) >> 32);
      out[i + 1] = static_cast<int64_t>(((r >> 32) * bound) >> 32);
    }
    if (i < n) out[i] = static_cast<int64_t>(((next() & 0xFFFFFFFFull) * bound) >> 32);
  }

 private:
  TANDEM_RNG_HD static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace tandem
