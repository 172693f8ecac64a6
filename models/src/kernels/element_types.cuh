// What the models layer's kernels share about their element types: float32 math on float, bf16
// and half values (one rounding back), and 16-byte vectors of them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::models::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

/// kVec elements loaded and stored as one access (16 bytes for the vector widths used here).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

}  // namespace tandem::models::kernels
