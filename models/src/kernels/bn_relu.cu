// The fused batch-norm apply: normalize with per-channel scale and shift, add the residual,
// ReLU, one read of x (and the residual) and one write of y. 16-byte vectors where every vector
// lies in one channel run (channels-last with C a multiple of the vector width, or NCHW with
// H*W one) and the pointers are aligned; one element a thread otherwise.
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdint>
#include <cuda_fp16.h>

#include "bn_relu_launch.h"
#include "tandem/error.h"

namespace tandem::models {
namespace {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// relu that keeps NaN, as torch.relu (clamp_min) does.
__device__ __forceinline__ float relu_keep_nan(float t) { return t < 0.f ? 0.f : t; }

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// kVec elements a thread, all of one channel run: channels-last vectors cover channels
// c0 .. c0 + kVec - 1; NCHW vectors one channel.
template <typename T, int kVec, bool kResidual>
__global__ void bn_apply_relu_vec(BnApplyRelu a) {
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const int64_t vectors = a.numel / kVec;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = v * kVec;
    const Pack<T, kVec> xv = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
    Pack<T, kVec> rv;
    if (kResidual) rv = reinterpret_cast<const Pack<T, kVec>*>(r)[v];
    Pack<T, kVec> out;
    if (a.channels_last) {
      const int64_t c0 = i % a.channels;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float t = to_float(xv.v[k]) * a.scale[c0 + k] + a.shift[c0 + k];
        if (kResidual) t += to_float(rv.v[k]);
        out.v[k] = from_float<T>(relu_keep_nan(t));
      }
    } else {
      const int64_t c = (i / a.spatial) % a.channels;
      const float s = a.scale[c], b = a.shift[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float t = to_float(xv.v[k]) * s + b;
        if (kResidual) t += to_float(rv.v[k]);
        out.v[k] = from_float<T>(relu_keep_nan(t));
      }
    }
    reinterpret_cast<Pack<T, kVec>*>(y)[v] = out;
  }
}

template <typename T>
__global__ void bn_apply_relu_scalar(BnApplyRelu a) {
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = a.channels_last ? i % a.channels : (i / a.spatial) % a.channels;
    float t = to_float(x[i]) * a.scale[c] + a.shift[c];
    if (r) t += to_float(r[i]);
    y[i] = from_float<T>(relu_keep_nan(t));
  }
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void launch_typed(const BnApplyRelu& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kThreads = 256;
  auto blocks_for = [](int64_t work) {
    // A grid-stride loop: enough blocks to fill the GPU several times over, no more.
    return static_cast<unsigned>(std::min<int64_t>((work + kThreads - 1) / kThreads, 65535));
  };
  const bool one_run = a.channels_last ? a.channels % kVec == 0 : a.spatial % kVec == 0;
  if (one_run && a.numel % kVec == 0 && aligned16(a.x) && aligned16(a.residual) &&
      aligned16(a.y)) {
    const unsigned blocks = blocks_for(a.numel / kVec);
    if (a.residual)
      bn_apply_relu_vec<T, kVec, true><<<blocks, kThreads, 0, stream>>>(a);
    else
      bn_apply_relu_vec<T, kVec, false><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    bn_apply_relu_scalar<T><<<blocks_for(a.numel), kThreads, 0, stream>>>(a);
  }
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_bn_apply_relu(const BnApplyRelu& args, cudaStream_t stream) {
  if (args.numel == 0) return;
  switch (args.dtype) {
    case BnDtype::kFloat: launch_typed<float>(args, stream); break;
    case BnDtype::kBFloat16: launch_typed<__nv_bfloat16>(args, stream); break;
    case BnDtype::kHalf: launch_typed<__half>(args, stream); break;
  }
}

}  // namespace tandem::models
