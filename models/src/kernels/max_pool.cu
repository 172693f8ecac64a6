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

// The kernels' grid: x across a row's (column, channel vector) pairs, y the row, z the image,
// so a thread finds its place with one 32-bit division where a flat index took four 64-bit ones
// (the stem's forward 0.29 -> 0.24 ms under Nsight Compute; the backward stayed at 0.46-0.48 ms,
// ~1.1 TB/s: not bound by its index arithmetic, and why is not known yet).
struct RowGrid {
  int groups;  // channel vectors
  int width;   // the row's columns
};

__device__ __forceinline__ bool place(const RowGrid& r, int& column, int& group) {
  const int x = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (x >= r.width * r.groups) return false;
  column = x / r.groups;
  group = x - column * r.groups;
  return true;
}

template <typename T, int kVec>
__global__ void __launch_bounds__(256)
    max_pool_forward(MaxPoolShape s, const T* x, T* y, uint8_t* window) {
  const int groups = static_cast<int>(s.channels / kVec);
  int ow = 0, g = 0;
  if (!place(RowGrid{groups, static_cast<int>(s.out_w)}, ow, g)) return;
  const int oh = static_cast<int>(blockIdx.y);
  const int64_t n = blockIdx.z;
  const int64_t i = ((n * s.out_h + oh) * s.out_w + ow) * groups + g;
  const int h0 = oh * 2 - 1, w0 = ow * 2 - 1;
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
    const int h = h0 + a;
    if (h < 0 || h >= s.h) continue;
#pragma unroll
    for (int b = 0; b < 3; ++b) {
      const int w = w0 + b;
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

// A thread takes a 2 x 2 patch of inputs, (2k, 2j) to (2k + 1, 2j + 1): the outputs whose
// windows cover it are (k, j), (k, j + 1), (k + 1, j) and (k + 1, j + 1) (where they exist),
// loaded once for the four inputs, where a thread an input loaded 9 windows for them (an
// output read by 2.25 threads on average, which held the backward at ~1.1 TB/s, measured).
// Each input sums the windows that picked it in the order rows, then columns: the same bits as
// one input at a time.
template <typename T, int kVec>
__global__ void __launch_bounds__(256)
    max_pool_backward(MaxPoolShape s, const T* grad_y, const uint8_t* window, T* grad_x) {
  const int groups = static_cast<int>(s.channels / kVec);
  int j = 0, g = 0;
  if (!place(RowGrid{groups, static_cast<int>((s.w + 1) / 2)}, j, g)) return;
  const int k = static_cast<int>(blockIdx.y);
  const int64_t n = blockIdx.z;
  Bytes<kVec> pos[2][2];
  Vec<T, kVec> gy[2][2];
  bool there[2][2];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int oh = k + a, ow = j + b;
      there[a][b] = oh < s.out_h && ow < s.out_w;
      if (there[a][b]) {
        const int64_t o = ((n * s.out_h + oh) * s.out_w + ow) * groups + g;
        pos[a][b] = reinterpret_cast<const Bytes<kVec>*>(window)[o];
        gy[a][b] = reinterpret_cast<const Vec<T, kVec>*>(grad_y)[o];
      }
    }
#pragma unroll
  for (int dh = 0; dh < 2; ++dh)
#pragma unroll
    for (int dw = 0; dw < 2; ++dw) {
      const int h = 2 * k + dh, w = 2 * j + dw;
      if (h >= s.h || w >= s.w) continue;
      float acc[kVec];
#pragma unroll
      for (int c = 0; c < kVec; ++c) acc[c] = 0.f;
        // The windows over (h, w): rows k .. k + dh, columns j .. j + dw (an even side is covered
        // by one window, an odd one by two), in that order.
#pragma unroll
      for (int a = 0; a <= dh; ++a)
#pragma unroll
        for (int b = 0; b <= dw; ++b) {
          if (!there[a][b]) continue;
          const int oh = k + a, ow = j + b;
          const uint8_t here = static_cast<uint8_t>((h - (oh * 2 - 1)) * 3 + (w - (ow * 2 - 1)));
#pragma unroll
          for (int c = 0; c < kVec; ++c)
            if (pos[a][b].v[c] == here) acc[c] += to_float(gy[a][b].v[c]);
        }
      Vec<T, kVec> out;
#pragma unroll
      for (int c = 0; c < kVec; ++c) out.v[c] = from_float<T>(acc[c]);
      reinterpret_cast<Vec<T, kVec>*>(grad_x)[((n * s.h + h) * s.w + w) * groups + g] = out;
    }
}

// The grid of a row layout: blocks of 256 threads across a row's `width` x `groups` vectors,
// one grid row per image row, one layer per image.
dim3 row_grid(int64_t width, int64_t groups, int64_t rows, int64_t images) {
  TANDEM_CHECK_ARG(rows <= 65535 && images <= 65535 && width * groups <= INT32_MAX,
                   "max pool: ", images, " images of ", rows, " rows of ", width * groups,
                   " channel vectors exceed the kernel's grid (at most 65535 rows and images)");
  return dim3(static_cast<unsigned>((width * groups + 255) / 256), static_cast<unsigned>(rows),
              static_cast<unsigned>(images));
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
    if (s.n * s.out_h * s.out_w * s.channels == 0) return;
    max_pool_forward<T, kVec>
        <<<row_grid(s.out_w, s.channels / kVec, s.out_h, s.n), 256, 0, stream>>>(
            s, static_cast<const T*>(x), static_cast<T*>(y), window);
  });
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

void launch_max_pool_backward(const MaxPoolShape& s, const void* grad_y, const uint8_t* window,
                              void* grad_x, cudaStream_t stream) {
  by_dtype(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if (s.n * s.h * s.w * s.channels == 0) return;
    // One thread a 2 x 2 patch: half the columns and rows.
    max_pool_backward<T, kVec>
        <<<row_grid((s.w + 1) / 2, s.channels / kVec, (s.h + 1) / 2, s.n), 256, 0, stream>>>(
            s, static_cast<const T*>(grad_y), window, static_cast<T*>(grad_x));
  });
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::models
