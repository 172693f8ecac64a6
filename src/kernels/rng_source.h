// Where a draw kernel's (seed, offset) come from: PyTorch's at::PhiloxCudaState, unpacked the
// same way. Shared by the kernels that draw per-sample parameters on the device (augment.cu,
// resized_crop.cu); plain types, so .cu files compile without LibTorch's headers.
#pragma once

#include <cstdint>

namespace tandem {

/// During graph capture seed and offset are read from device memory when the kernel runs, so
/// each replay draws anew; otherwise they are the values of the eager call.
struct RngSource {
  bool captured;
  uint64_t seed, offset;       // not captured
  const int64_t* seed_ptr;     // captured
  const int64_t* offset_ptr;   // captured
  uint64_t offset_intragraph;  // captured

#ifdef __CUDACC__
  /// (seed, offset) as the running kernel sees them (at::cuda::philox::unpack's rule).
  __device__ void unpack(uint64_t& s, uint64_t& o) const {
    s = seed;
    o = offset;
    if (captured) {
      s = static_cast<uint64_t>(*seed_ptr);
      o = static_cast<uint64_t>(*offset_ptr) + offset_intragraph;
    }
  }
#endif
};

}  // namespace tandem
