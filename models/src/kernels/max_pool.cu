// The ResNet stem's max pool, channels-last, 16-byte vectors of channels a thread.
//
// Written here because LibTorch's channels-last max pool keeps int64 indices (eight bytes per
// output element, twice the bf16 output itself) and its backward scatters through them at a
// small fraction of the memory bandwidth (1.8 ms of a ResNet step on an H200 for one 400 MB
// gradient, measured). Here the forward keeps one byte per element (the position in the 3x3
// window) and the backward gathers: each input vector reads the at most four outputs that can
// have picked it and writes its gradient once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "element_types.cuh"
#include "max_pool_launch.h"
#include "tandem/error.h"

namespace tandem::models {
namespace {

using kernels::from_float;
using kernels::to_float;
template <typename T, int kVec>
using Vec = kernels::Pack<T, kVec>;

template <int kVec>
struct alignas(kVec) Bytes {
  uint8_t v[kVec];
};

template <typename T, int kVec>
__global__ void __launch_bounds__(256)
    max_pool_forward(MaxPoolShape s, const T* x, T* y, uint8_t* window) {
  const int64_t groups = s.channels / kVec;
  const int64_t total = s.n * s.out_h * s.out_w * groups;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i % groups;
    int64_t rest = i / groups;
    const int64_t ow = rest % s.out_w;
    rest /= s.out_w;
    const int64_t oh = rest % s.out_h, n = rest / s.out_h;
    const int64_t h0 = oh * 2 - 1, w0 = ow * 2 - 1;
    const int first = (h0 < 0 ? 3 : 0) + (w0 < 0 ? 1 : 0);  // the first valid position
    float best[kVec];
    uint8_t at[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      best[k] = -INFINITY;
      at[k] = static_cast<uint8_t>(first);
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const int64_t h = h0 + a;
      if (h < 0 || h >= s.h) continue;
#pragma unroll
      for (int b = 0; b < 3; ++b) {
        const int64_t w = w0 + b;
        if (w < 0 || w >= s.w) continue;
        const Vec<T, kVec> p =
            reinterpret_cast<const Vec<T, kVec>*>(x)[((n * s.h + h) * s.w + w) * groups + g];
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float v = to_float(p.v[k]);
          if (v > best[k] || isnan(v)) {
            best[k] = v;
            at[k] = static_cast<uint8_t>(a * 3 + b);
          }
        }
      }
    }
    Vec<T, kVec> out;
    Bytes<kVec> pos;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      out.v[k] = from_float<T>(best[k]);
      pos.v[k] = at[k];
    }
    reinterpret_cast<Vec<T, kVec>*>(y)[i] = out;
    reinterpret_cast<Bytes<kVec>*>(window)[i] = pos;
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(256)
    max_pool_backward(MaxPoolShape s, const T* grad_y, const uint8_t* window, T* grad_x) {
  const int64_t groups = s.channels / kVec;
  const int64_t total = s.n * s.h * s.w * groups;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i % groups;
    int64_t rest = i / groups;
    const int64_t w = rest % s.w;
    rest /= s.w;
    const int64_t h = rest % s.h, n = rest / s.h;
    // The outputs whose window covers (h, w): oh*2-1 <= h <= oh*2+1.
    const int64_t oh_lo = h / 2, oh_hi = (h + 1) / 2 < s.out_h ? (h + 1) / 2 : s.out_h - 1;
    const int64_t ow_lo = w / 2, ow_hi = (w + 1) / 2 < s.out_w ? (w + 1) / 2 : s.out_w - 1;
    float acc[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = 0.f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = ((n * s.out_h + oh) * s.out_w + ow) * groups + g;
        const uint8_t here = static_cast<uint8_t>((h - (oh * 2 - 1)) * 3 + (w - (ow * 2 - 1)));
        const Bytes<kVec> pos = reinterpret_cast<const Bytes<kVec>*>(window)[o];
        const Vec<T, kVec> gy = reinterpret_cast<const Vec<T, kVec>*>(grad_y)[o];
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          if (pos.v[k] == here) acc[k] += to_float(gy.v[k]);
      }
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = from_float<T>(acc[k]);
    reinterpret_cast<Vec<T, kVec>*>(grad_x)[i] = out;
  }
}

unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 65535));
}

template <typename F>
void by_dtype(BnDtype dtype, F&& f) {
  switch (dtype) {
    case BnDtype::kFloat:
      f(float{});
      break;
    case BnDtype::kBFloat16:
      f(__nv_bfloat16{});
      break;
    case BnDtype::kHalf:
      f(__half{});
      break;
  }
}

}  // namespace

void launch_max_pool_forward(const MaxPoolShape& s, const void* x, void* y, uint8_t* window,
                             cudaStream_t stream) {
  by_dtype(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const int64_t work = s.n * s.out_h * s.out_w * (s.channels / kVec);
    if (work == 0) return;
    max_pool_forward<T, kVec><<<blocks_for(work), 256, 0, stream>>>(s, static_cast<const T*>(x),
                                                                    static_cast<T*>(y), window);
  });
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

void launch_max_pool_backward(const MaxPoolShape& s, const void* grad_y, const uint8_t* window,
                              void* grad_x, cudaStream_t stream) {
  by_dtype(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const int64_t work = s.n * s.h * s.w * (s.channels / kVec);
    if (work == 0) return;
    max_pool_backward<T, kVec><<<blocks_for(work), 256, 0, stream>>>(
        s, static_cast<const T*>(grad_y), window, static_cast<T*>(grad_x));
  });
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::models
