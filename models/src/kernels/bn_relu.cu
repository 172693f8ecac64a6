// The fused batch-norm kernels (bn_relu_launch.h says what each computes).
//
// The apply: normalize with per-channel scale and shift, add the residual, ReLU, one read of x
// (and the residual) and one write of y. 16-byte vectors where every vector lies in one channel
// run (channels-last with C a multiple of the vector width, or NCHW with H*W one) and the
// pointers are aligned; one element a thread otherwise.
//
// The channels-last statistics and backward are written here rather than taken from LibTorch
// (batch_norm_stats, batch_norm_backward_reduce / _elemt) because those read a ResNet's
// activations at a fraction of the memory bandwidth (the statistics kernel at about a quarter of
// it on an H200, measured) and cannot take the ReLU's mask, so the mask had to be applied by a
// separate pass that reads the output again. Each thread here owns one 16-byte vector's channels
// and walks a strided set of rows, several rows in flight, keeping its per-channel constants
// and sums in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "bn_relu_launch.h"
#include "element_types.cuh"
#include "tandem/error.h"

namespace tandem::models {
namespace {

using kernels::from_float;
using kernels::Pack;
using kernels::to_float;

// relu that keeps NaN, as torch.relu (clamp_min) does.
__device__ __forceinline__ float relu_keep_nan(float t) { return t < 0.f ? 0.f : t; }

// One vector's apply: scale and shift per element, the residual, the ReLU, rounded to T; with
// kMask, bit k of the returned mask says element k's rounded output is positive (as
// threshold_backward on y would see it). The NCHW and the channels-last kernels both apply
// through this, so both give the same bits.
template <typename T, int kVec, bool kResidual, bool kRelu, bool kMask>
__device__ __forceinline__ unsigned apply_vector(const Pack<T, kVec>& xv, const Pack<T, kVec>& rv,
                                                 const float (&scale)[kVec],
                                                 const float (&shift)[kVec], Pack<T, kVec>& out) {
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    float t = to_float(xv.v[k]) * scale[k] + shift[k];
    if (kResidual) t += to_float(rv.v[k]);
    if (kRelu) t = relu_keep_nan(t);
    out.v[k] = from_float<T>(t);
    if (kMask) bits |= (to_float(out.v[k]) > 0.f ? 1u : 0u) << k;
  }
  return bits;
}

// NCHW with H*W a multiple of kVec: every vector lies in one channel. (Channels-last vectors go
// to bn_apply_rows, below.)
template <typename T, int kVec, bool kResidual, bool kRelu, bool kMask>
__global__ void bn_apply_relu_vec(BnApplyRelu a) {
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const int64_t vectors = a.numel / kVec;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (v * kVec / a.spatial) % a.channels;
    float scale[kVec], shift[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      scale[k] = a.scale[c];
      shift[k] = a.shift[c];
    }
    const Pack<T, kVec> xv = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
    Pack<T, kVec> rv;
    if (kResidual) rv = reinterpret_cast<const Pack<T, kVec>*>(r)[v];
    Pack<T, kVec> out;
    const unsigned bits = apply_vector<T, kVec, kResidual, kRelu, kMask>(xv, rv, scale, shift, out);
    reinterpret_cast<Pack<T, kVec>*>(y)[v] = out;
    if (kMask) a.mask[v] = static_cast<uint8_t>(bits);
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
    y[i] = from_float<T>(a.relu ? relu_keep_nan(t) : t);
  }
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int kVec, bool kResidual>
void launch_vec(const BnApplyRelu& a, unsigned blocks, unsigned threads, cudaStream_t stream) {
  if (!a.relu)
    bn_apply_relu_vec<T, kVec, kResidual, false, false><<<blocks, threads, 0, stream>>>(a);
  else if (a.mask)
    bn_apply_relu_vec<T, kVec, kResidual, true, true><<<blocks, threads, 0, stream>>>(a);
  else
    bn_apply_relu_vec<T, kVec, kResidual, true, false><<<blocks, threads, 0, stream>>>(a);
}

int vector_width(BnDtype dtype) { return dtype == BnDtype::kFloat ? 4 : 8; }

bool vectorized(const BnApplyRelu& a) {
  const int vec = vector_width(a.dtype);
  const bool one_run = a.channels_last ? a.channels % vec == 0 : a.spatial % vec == 0;
  return one_run && a.numel % vec == 0 && aligned16(a.x) && aligned16(a.residual) && aligned16(a.y);
}

// The channels-last vector path (below, with the reductions' grid).
template <typename T>
void launch_apply_rows(const BnApplyRelu& a, cudaStream_t stream);

template <typename T>
void launch_typed(const BnApplyRelu& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kThreads = 256;
  auto blocks_for = [](int64_t work) {
    // A grid-stride loop: enough blocks to fill the GPU several times over, no more.
    return static_cast<unsigned>(std::min<int64_t>((work + kThreads - 1) / kThreads, 65535));
  };
  if (vectorized(a) && a.channels_last) {
    launch_apply_rows<T>(a, stream);
  } else if (vectorized(a)) {
    const unsigned blocks = blocks_for(a.numel / kVec);
    if (a.residual)
      launch_vec<T, kVec, true>(a, blocks, kThreads, stream);
    else
      launch_vec<T, kVec, false>(a, blocks, kThreads, stream);
  } else {
    bn_apply_relu_scalar<T><<<blocks_for(a.numel), kThreads, 0, stream>>>(a);
  }
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int bn_vector_width(BnDtype dtype) { return vector_width(dtype); }

bool bn_apply_vectorized(const BnApplyRelu& a) { return vectorized(a); }

void launch_bn_apply_relu(const BnApplyRelu& args, cudaStream_t stream) {
  if (args.numel == 0) return;
  TANDEM_CHECK_ARG(!args.mask || vectorized(args),
                   "the batch-norm apply writes a mask only on its 16-byte vector path");
  switch (args.dtype) {
    case BnDtype::kFloat:
      launch_typed<float>(args, stream);
      break;
    case BnDtype::kBFloat16:
      launch_typed<__nv_bfloat16>(args, stream);
      break;
    case BnDtype::kHalf:
      launch_typed<__half>(args, stream);
      break;
  }
}

// ---- channels-last statistics and backward --------------------------------------------------
namespace {

constexpr int kRowsInFlight = 4;  // loads a thread issues before it sums them
// The finalize kernels: kFinalizeChannels channels a block, kFinalizeLanes threads a channel,
// each combining every kFinalizeLanes-th split, several loads in flight (a chain of one load a
// step, at the memory's latency, took 25 us a call with 8 lanes, measured).
constexpr int kFinalizeChannels = 8, kFinalizeLanes = 32;
static_assert((kFinalizeLanes & (kFinalizeLanes - 1)) == 0, "the finalize's lane tree halves");

// The block shape of the channels-last kernels: tx threads across a row's vectors, ty down its
// rows, gx blocks across the vectors, splits blocks down the rows.
struct Grid {
  int groups;  // vectors per row
  int tx, ty, gx, splits;
};

int device_multiprocessors() {
  int device = 0, sms = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// Blocks of `threads` threads of `kernel` one multiprocessor holds at once (registers and shared
// memory permitting), asked of the runtime once per kernel and block size.
int resident_blocks(const void* kernel, int threads) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({kernel, threads}, 0);
  if (fresh) {
    TANDEM_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, 0));
    it->second = std::max(it->second, 1);
  }
  return it->second;
}

// At most this many 256-thread blocks fit a multiprocessor (2048 threads): the splits any
// kernel here can ask for, which sizes the partials' workspace.
constexpr int kMaxResidentBlocks = 8;

// The grid of one wave: as many blocks as the GPU holds at once (`per_sm` a multiprocessor), no
// more splits than rows to share or than the workspace holds (`capacity`).
Grid grid_for(const BnRows& t, int per_sm, int capacity) {
  Grid g;
  g.groups = static_cast<int>(t.channels / vector_width(t.dtype));
  g.tx = std::min(g.groups, 32);
  g.ty = 256 / g.tx;
  g.gx = (g.groups + g.tx - 1) / g.tx;
  const int64_t row_blocks = (t.rows + g.ty - 1) / g.ty;
  const int64_t wanted =
      (static_cast<int64_t>(per_sm) * device_multiprocessors() + g.gx - 1) / g.gx;
  g.splits = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({row_blocks, wanted, static_cast<int64_t>(capacity)})));
  return g;
}

// One grid for every kernel of `kernels` (a shape they share): a wave of the one of them that
// fewest blocks of fit a multiprocessor.
Grid grid_for(const BnRows& t, std::initializer_list<const void*> kernels, int capacity) {
  const Grid shape = grid_for(t, 1, capacity);
  int per_sm = std::numeric_limits<int>::max();
  for (const void* kernel : kernels)
    per_sm = std::min(per_sm, resident_blocks(kernel, shape.tx * shape.ty));
  return grid_for(t, per_sm, capacity);
}

template <typename Kernel>
Grid grid_for(const BnRows& t, Kernel kernel, int capacity) {
  return grid_for(t, {reinterpret_cast<const void*>(kernel)}, capacity);
}

// The parts of a block's `rows` rows of threads combined in a tree: at each level, row r < half
// takes in row r + half where that exists (`take_in(half)`, called on the taking thread where
// `active`), half the largest power of two below `rows`, then half / 2, ..., each level behind
// a barrier that every thread of the block reaches. log2(rows) dependent steps where one row
// taking in the others in sequence took rows - 1.
template <typename TakeIn>
__device__ __forceinline__ void combine_rows_in_tree(int rows, int row, bool active,
                                                     TakeIn take_in) {
  int half = 1;
  while (half * 2 < rows) half *= 2;
  for (half = rows > 1 ? half : 0; half > 0; half /= 2) {
    if (active && row < half && row + half < rows) take_in(half);
    __syncthreads();
  }
}

// Chan's combination of (count, mean, M2) with another part.
__device__ __forceinline__ void combine(float& n, float& mean, float& m2, float nb, float meanb,
                                        float m2b) {
  if (nb == 0.f) return;
  const float total = n + nb;
  const float delta = meanb - mean;
  const float share = nb / total;
  mean += delta * share;
  m2 += m2b + delta * delta * n * share;
  n = total;
}

// Partials: [split][2][C] floats, then [split] counts.
template <typename T, int kVec>
__global__ void __launch_bounds__(256) stats_partials(BnRows t, Grid g, float* partials) {
  __shared__ float sh_mean[256 * 8], sh_m2[256 * 8], sh_n[256];
  const T* x = static_cast<const T*>(t.x);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * g.tx + tx;
  const int group = blockIdx.x * g.tx + tx;
  const int64_t step = static_cast<int64_t>(g.splits) * g.ty;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * g.ty + ty;
  float shift[kVec], s1[kVec], s2[kVec];
  int64_t n = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) shift[k] = s1[k] = s2[k] = 0.f;
  if (group < g.groups && first < t.rows) {
    // Sums of x - shift, the shift this thread's first row: stable when the spread is small
    // against the mean, which plain sums of x and x*x are not.
    const Pack<T, kVec> p0 = reinterpret_cast<const Pack<T, kVec>*>(x)[first * g.groups + group];
#pragma unroll
    for (int k = 0; k < kVec; ++k) shift[k] = to_float(p0.v[k]);
    for (int64_t r = first; r < t.rows; r += kRowsInFlight * step) {
      Pack<T, kVec> p[kRowsInFlight];
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j)
        if (r + j * step < t.rows)
          p[j] = reinterpret_cast<const Pack<T, kVec>*>(x)[(r + j * step) * g.groups + group];
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        if (r + j * step >= t.rows) break;
        ++n;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float d = to_float(p[j].v[k]) - shift[k];
          s1[k] += d;
          s2[k] = fmaf(d, d, s2[k]);
        }
      }
    }
  }
  const float nf = static_cast<float>(n);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float m = n > 0 ? s1[k] / nf : 0.f;
    sh_mean[tid * kVec + k] = shift[k] + m;
    sh_m2[tid * kVec + k] = n > 0 ? fmaxf(s2[k] - s1[k] * m, 0.f) : 0.f;
  }
  sh_n[tid] = nf;
  __syncthreads();
  // The block's rows combined in a tree (combine_rows_in_tree): a row of threads combining the
  // others' parts in sequence took ~25 us a call at 64 channels (31 dependent combines of 8
  // channels on 8 threads), as long as the loads of a 100 MB activation.
  combine_rows_in_tree(g.ty, ty, group < g.groups, [&](int half) {
    const int o = (ty + half) * g.tx + tx;
    const float nb = sh_n[o];
    float n_here = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float cn = sh_n[tid], mean = sh_mean[tid * kVec + k], m2 = sh_m2[tid * kVec + k];
      combine(cn, mean, m2, nb, sh_mean[o * kVec + k], sh_m2[o * kVec + k]);
      sh_mean[tid * kVec + k] = mean;
      sh_m2[tid * kVec + k] = m2;
      n_here = cn;
    }
    sh_n[tid] = n_here;
  });
  if (ty != 0 || group >= g.groups) return;
  const int channels = g.groups * kVec;
  float* out_mean = partials + static_cast<int64_t>(blockIdx.y) * 2 * channels;
  float* out_m2 = out_mean + channels;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    out_mean[group * kVec + k] = sh_mean[tx * kVec + k];
    out_m2[group * kVec + k] = sh_m2[tx * kVec + k];
  }
  if (blockIdx.x == 0 && tx == 0)
    partials[static_cast<int64_t>(g.splits) * 2 * channels + blockIdx.y] = sh_n[tx];
}

// One thread per channel and lane: lanes combine every kFinalizeLanes-th split, lane 0 the
// lanes in order.
__global__ void stats_finalize(BnStats a, int channels, int splits) {
  __shared__ float sh[3][kFinalizeLanes][kFinalizeChannels];
  const int c = blockIdx.x * kFinalizeChannels + threadIdx.x, lane = threadIdx.y;
  float n = 0.f, mean = 0.f, m2 = 0.f;
  if (a.sums != nullptr) {
    // Plain sums (a convolution's epilogue), one "split" on lane 0: the mean and the sum of
    // squared deviations from them. Σx² − (Σx)²/n loses digits where the mean is large against
    // the spread, which the shifted sums above avoid; it is the statistic cuDNN's fused graph
    // gives, in float32 as NVIDIA's fused ResNet-50 uses it.
    if (c < channels && lane == 0) {
      n = static_cast<float>(a.in.rows);
      const float sum = a.sums[c], squares = a.sums[channels + c];
      mean = sum / n;
      m2 = fmaxf(squares - sum * mean, 0.f);
    }
  } else if (c < channels) {
    const float* counts = a.partials + static_cast<int64_t>(splits) * 2 * channels;
    for (int s0 = lane; s0 < splits; s0 += 4 * kFinalizeLanes) {
      float pn[4], pmean[4], pm2[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int s = s0 + j * kFinalizeLanes;
        const float* part = a.partials + static_cast<int64_t>(s) * 2 * channels;
        pn[j] = s < splits ? counts[s] : 0.f;
        pmean[j] = s < splits ? part[c] : 0.f;
        pm2[j] = s < splits ? part[channels + c] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) combine(n, mean, m2, pn[j], pmean[j], pm2[j]);
    }
  }
  sh[0][lane][threadIdx.x] = n;
  sh[1][lane][threadIdx.x] = mean;
  sh[2][lane][threadIdx.x] = m2;
  __syncthreads();
  // The lanes combined in a tree, as the partials' rows (31 dependent combines on lane 0 before).
  combine_rows_in_tree(kFinalizeLanes, lane, true, [&](int half) {
    combine(n, mean, m2, sh[0][lane + half][threadIdx.x], sh[1][lane + half][threadIdx.x],
            sh[2][lane + half][threadIdx.x]);
    sh[0][lane][threadIdx.x] = n;
    sh[1][lane][threadIdx.x] = mean;
    sh[2][lane][threadIdx.x] = m2;
  });
  if (lane != 0 || c >= channels) return;
  const float var = m2 / n;
  const float invstd = rsqrtf(var + a.eps);
  const float scale = a.weight[c] * invstd;
  a.mean[c] = mean;
  a.invstd[c] = invstd;
  a.scale[c] = scale;
  a.shift[c] = a.bias[c] - mean * scale;
  if (a.running_mean)
    a.running_mean[c] = (1.f - a.momentum) * a.running_mean[c] + a.momentum * mean;
  if (a.running_var) {
    const float unbiased = n > 1.f ? var * n / (n - 1.f) : var;
    a.running_var[c] = (1.f - a.momentum) * a.running_var[c] + a.momentum * unbiased;
  }
  if (a.num_batches && c == 0) *a.num_batches += 1;
}

// Sums of the masked gradient and of it times (x - mean): [split][2][C]. kTwoGrads: the gradient
// is grad + grad2, rounded once to T (as autograd's add of the two would), written masked to
// grad_sum: the residual's gradient, and what the pass writing dL/dx reads.
template <typename T, int kVec, bool kMask, bool kTwoGrads>
__global__ void __launch_bounds__(256) backward_partials(BnBackward a, Grid g) {
  // Two gradients: two rows in flight (six loads), not four (twelve took 98-116 registers a
  // thread, two blocks a multiprocessor where the grid counts on the single gradient's three).
  // The rows are summed in the same order either way.
  constexpr int kRows = kTwoGrads ? 2 : kRowsInFlight;
  __shared__ float sh_dy[256 * 8], sh_dyx[256 * 8];
  const T* x = static_cast<const T*>(a.in.x);
  const T* dy = static_cast<const T*>(a.grad);
  const T* dy2 = static_cast<const T*>(a.grad2);
  T* dy_sum = static_cast<T*>(a.grad_sum);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * g.tx + tx;
  const int group = blockIdx.x * g.tx + tx;
  const int64_t step = static_cast<int64_t>(g.splits) * g.ty;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * g.ty + ty;
  float mean[kVec], s_dy[kVec], s_dyx[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) mean[k] = s_dy[k] = s_dyx[k] = 0.f;
  if (group < g.groups) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) mean[k] = a.mean[group * kVec + k];
    for (int64_t r = first; r < a.in.rows; r += kRows * step) {
      // Every row's loads issued before the first store: the store of the summed gradient may
      // alias the inputs as far as the compiler knows, so a store between them kept the next
      // row's loads behind it (2.8 TB/s on an H200 where the elementwise pass over the same
      // bytes ran at 3.75, measured).
      Pack<T, kVec> pg[kRows], px[kRows], p2[kTwoGrads ? kRows : 1];
      unsigned bits[kRows];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int64_t row = r + j * step;
        if (row < a.in.rows) {
          const int64_t v = row * g.groups + group;
          pg[j] = reinterpret_cast<const Pack<T, kVec>*>(dy)[v];
          px[j] = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
          bits[j] = kMask ? a.mask[v] : 0xffu;
          if (kTwoGrads) p2[j] = reinterpret_cast<const Pack<T, kVec>*>(dy2)[v];
        }
      }
      if (kTwoGrads) {
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          const int64_t row = r + j * step;
          if (row >= a.in.rows) break;
#pragma unroll
          for (int k = 0; k < kVec; ++k)
            pg[j].v[k] = (bits[j] >> k) & 1u
                             ? from_float<T>(to_float(pg[j].v[k]) + to_float(p2[j].v[k]))
                             : from_float<T>(0.f);
          reinterpret_cast<Pack<T, kVec>*>(dy_sum)[row * g.groups + group] = pg[j];
        }
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (r + j * step >= a.in.rows) break;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float d = (bits[j] >> k) & 1u ? to_float(pg[j].v[k]) : 0.f;
          s_dy[k] += d;
          s_dyx[k] = fmaf(d, to_float(px[j].v[k]) - mean[k], s_dyx[k]);
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sh_dy[tid * kVec + k] = s_dy[k];
    sh_dyx[tid * kVec + k] = s_dyx[k];
  }
  __syncthreads();
  // The block's rows summed in a tree, as stats_partials combines them.
  combine_rows_in_tree(g.ty, ty, group < g.groups, [&](int half) {
    const int o = (ty + half) * g.tx + tx;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      sh_dy[tid * kVec + k] += sh_dy[o * kVec + k];
      sh_dyx[tid * kVec + k] += sh_dyx[o * kVec + k];
    }
  });
  if (ty != 0 || group >= g.groups) return;
  const int channels = g.groups * kVec;
  float* out_dy = a.partials + static_cast<int64_t>(blockIdx.y) * 2 * channels;
  float* out_dyx = out_dy + channels;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    out_dy[group * kVec + k] = sh_dy[tx * kVec + k];
    out_dyx[group * kVec + k] = sh_dyx[tx * kVec + k];
  }
}

// The sums over the splits, the weight and bias gradients, and dL/dx's coefficients:
// dx = A * dy' + B * (x - mean) + D with A = weight * invstd, B = -A * invstd^2 * sum(dy'(x -
// mean)) / n, D = -A * sum(dy') / n (BatchNorm's backward, grouped per channel).
__global__ void backward_finalize(BnBackward a, int channels, int splits) {
  __shared__ float sh[2][kFinalizeLanes][kFinalizeChannels];
  const int c = blockIdx.x * kFinalizeChannels + threadIdx.x, lane = threadIdx.y;
  float sum_dy = 0.f, sum_dyx = 0.f;
  if (c < channels)
#pragma unroll 4
    for (int s = lane; s < splits; s += kFinalizeLanes) {
      const float* part = a.partials + static_cast<int64_t>(s) * 2 * channels;
      sum_dy += part[c];
      sum_dyx += part[channels + c];
    }
  sh[0][lane][threadIdx.x] = sum_dy;
  sh[1][lane][threadIdx.x] = sum_dyx;
  __syncthreads();
  combine_rows_in_tree(kFinalizeLanes, lane, true, [&](int half) {
    sum_dy += sh[0][lane + half][threadIdx.x];
    sum_dyx += sh[1][lane + half][threadIdx.x];
    sh[0][lane][threadIdx.x] = sum_dy;
    sh[1][lane][threadIdx.x] = sum_dyx;
  });
  if (lane != 0 || c >= channels) return;
  const float invstd = a.invstd[c];
  if (a.grad_weight) a.grad_weight[c] = sum_dyx * invstd;
  if (a.grad_bias) a.grad_bias[c] = sum_dy;
  const float inv_n = 1.f / static_cast<float>(a.in.rows);
  const float coef_a = a.weight[c] * invstd;
  a.coefficients[c] = coef_a;
  a.coefficients[channels + c] = -coef_a * invstd * invstd * sum_dyx * inv_n;
  a.coefficients[2 * channels + c] = -coef_a * sum_dy * inv_n;
}

// Two rows in flight, not four: four took 128 and more registers a thread, one block a
// multiprocessor.
constexpr int kElementwiseRows = 2;

template <typename T, int kVec, bool kMask, bool kGradX, bool kGradResidual>
__global__ void __launch_bounds__(256) backward_elementwise(BnBackward a, Grid g) {
  constexpr int kRowsInFlight = kElementwiseRows;
  const T* x = static_cast<const T*>(a.in.x);
  const T* dy = static_cast<const T*>(a.grad);
  T* dx = static_cast<T*>(a.grad_x);
  T* dres = static_cast<T*>(a.grad_residual);
  const int group = blockIdx.x * g.tx + threadIdx.x;
  if (group >= g.groups) return;
  const int channels = g.groups * kVec;
  float mean[kVec], ca[kVec], cb[kVec], cd[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int c = group * kVec + k;
    mean[k] = a.mean[c];
    ca[k] = a.coefficients[c];
    cb[k] = a.coefficients[channels + c];
    cd[k] = a.coefficients[2 * channels + c];
  }
  const int64_t step = static_cast<int64_t>(g.splits) * g.ty;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * g.ty + threadIdx.y;
  for (int64_t r = first; r < a.in.rows; r += kRowsInFlight * step) {
    Pack<T, kVec> pg[kRowsInFlight], px[kRowsInFlight];
    unsigned bits[kRowsInFlight];
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int64_t row = r + j * step;
      if (row < a.in.rows) {
        const int64_t v = row * g.groups + group;
        pg[j] = reinterpret_cast<const Pack<T, kVec>*>(dy)[v];
        if (kGradX) px[j] = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
        bits[j] = kMask ? a.mask[v] : 0xffu;
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int64_t row = r + j * step;
      if (row >= a.in.rows) break;
      const int64_t v = row * g.groups + group;
      Pack<T, kVec> out_x, out_r;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const bool keep = (bits[j] >> k) & 1u;
        if (kGradResidual) out_r.v[k] = keep ? pg[j].v[k] : from_float<T>(0.f);
        if (kGradX) {
          const float d = keep ? to_float(pg[j].v[k]) : 0.f;
          out_x.v[k] =
              from_float<T>(fmaf(ca[k], d, fmaf(cb[k], to_float(px[j].v[k]) - mean[k], cd[k])));
        }
      }
      if (kGradX) reinterpret_cast<Pack<T, kVec>*>(dx)[v] = out_x;
      if (kGradResidual) reinterpret_cast<Pack<T, kVec>*>(dres)[v] = out_r;
    }
  }
}

template <typename T, bool kMask, bool kGradX, bool kGradResidual>
void launch_elementwise(const BnBackward& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  auto* kernel = backward_elementwise<T, kVec, kMask, kGradX, kGradResidual>;
  // No workspace: any number of splits.
  const Grid g = grid_for(a.in, kernel, std::numeric_limits<int>::max());
  kernel<<<dim3(g.gx, g.splits), dim3(g.tx, g.ty), 0, stream>>>(a, g);
}

// The channels-last apply laid out as backward_elementwise: a thread owns one vector of
// channels, its scales and shifts in registers (loaded once), and walks rows, kElementwiseRows
// in flight. The flat grid-stride form (bn_apply_relu_vec, now NCHW's only) found each vector's
// channel with a 64-bit division and loaded its 16 constants again for every vector: 2.1 TB/s on
// the block outputs and 0.9-1.6 TB/s on the small activations, measured. The same arithmetic,
// so the same bits.
template <typename T, int kVec, bool kResidual, bool kRelu, bool kMask>
__global__ void __launch_bounds__(256) bn_apply_rows(BnApplyRelu a, Grid g) {
  constexpr int kRowsInFlight = kElementwiseRows;
  const int group = blockIdx.x * g.tx + threadIdx.x;
  if (group >= g.groups) return;
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  float scale[kVec], shift[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    scale[k] = a.scale[group * kVec + k];
    shift[k] = a.shift[group * kVec + k];
  }
  const int64_t rows = a.numel / a.channels;
  const int64_t step = static_cast<int64_t>(g.splits) * g.ty;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * g.ty + threadIdx.y;
  for (int64_t r = first; r < rows; r += kRowsInFlight * step) {
    Pack<T, kVec> px[kRowsInFlight], pr[kRowsInFlight];
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int64_t row = r + j * step;
      if (row < rows) {
        const int64_t v = row * g.groups + group;
        px[j] = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
        if (kResidual) pr[j] = reinterpret_cast<const Pack<T, kVec>*>(res)[v];
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
      const int64_t row = r + j * step;
      if (row >= rows) break;
      const int64_t v = row * g.groups + group;
      Pack<T, kVec> out;
      const unsigned bits =
          apply_vector<T, kVec, kResidual, kRelu, kMask>(px[j], pr[j], scale, shift, out);
      reinterpret_cast<Pack<T, kVec>*>(y)[v] = out;
      if (kMask) a.mask[v] = static_cast<uint8_t>(bits);
    }
  }
}

template <typename T, bool kResidual, bool kRelu, bool kMask>
void launch_apply_rows_as(const BnApplyRelu& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  auto* kernel = bn_apply_rows<T, kVec, kResidual, kRelu, kMask>;
  const BnRows shape{a.x, a.numel / a.channels, a.channels, a.dtype};
  const Grid g = grid_for(shape, kernel, std::numeric_limits<int>::max());  // no workspace
  kernel<<<dim3(g.gx, g.splits), dim3(g.tx, g.ty), 0, stream>>>(a, g);
}

template <typename T>
void launch_apply_rows(const BnApplyRelu& a, cudaStream_t stream) {
  const bool residual = a.residual != nullptr;
  if (!a.relu)
    residual ? launch_apply_rows_as<T, true, false, false>(a, stream)
             : launch_apply_rows_as<T, false, false, false>(a, stream);
  else if (a.mask)
    residual ? launch_apply_rows_as<T, true, true, true>(a, stream)
             : launch_apply_rows_as<T, false, true, true>(a, stream);
  else
    residual ? launch_apply_rows_as<T, true, true, false>(a, stream)
             : launch_apply_rows_as<T, false, true, false>(a, stream);
}

template <typename T, bool kMask>
void launch_backward_typed(const BnBackward& two, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  auto* partials = two.grad2 ? backward_partials<T, kVec, kMask, true>
                             : backward_partials<T, kVec, kMask, false>;
  // One grid for both kernels: the same splits, so the sums combine in the same order and give
  // the same bits as the single gradient's kernel on the summed gradient (at most the
  // workspace's splits). Sized by the kernel of the two that fewer blocks of fit a
  // multiprocessor: a grid of the other's wave ran the two-gradient kernel in one and a half.
  const Grid g = grid_for(two.in,
                          {reinterpret_cast<const void*>(backward_partials<T, kVec, kMask, false>),
                           reinterpret_cast<const void*>(backward_partials<T, kVec, kMask, true>)},
                          two.splits);
  const int channels = static_cast<int>(two.in.channels);
  partials<<<dim3(g.gx, g.splits), dim3(g.tx, g.ty), 0, stream>>>(two, g);
  TANDEM_CUDA_CHECK(cudaGetLastError());
  backward_finalize<<<(channels + kFinalizeChannels - 1) / kFinalizeChannels,
                      dim3(kFinalizeChannels, kFinalizeLanes), 0, stream>>>(two, channels,
                                                                            g.splits);
  TANDEM_CUDA_CHECK(cudaGetLastError());
  if (two.grad2) {
    // The pass writing dL/dx reads the masked sum, and writes no residual's gradient: the sum is
    // it (one write of the activation saved).
    BnBackward a = two;
    a.grad = two.grad_sum;
    a.mask = nullptr;
    if (a.grad_x) launch_elementwise<T, false, true, false>(a, stream);
  } else if (two.grad_x && two.grad_residual) {
    launch_elementwise<T, kMask, true, true>(two, stream);
  } else if (two.grad_x) {
    launch_elementwise<T, kMask, true, false>(two, stream);
  } else if (two.grad_residual) {
    launch_elementwise<T, kMask, false, true>(two, stream);
  }
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_stats_typed(const BnStats& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int channels = static_cast<int>(a.in.channels);
  if (a.sums != nullptr) {  // the statistics given: the finalize alone
    stats_finalize<<<(channels + kFinalizeChannels - 1) / kFinalizeChannels,
                     dim3(kFinalizeChannels, kFinalizeLanes), 0, stream>>>(a, channels, 0);
    TANDEM_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto* partials = stats_partials<T, kVec>;
  const Grid g = grid_for(a.in, partials, a.splits);
  partials<<<dim3(g.gx, g.splits), dim3(g.tx, g.ty), 0, stream>>>(a.in, g, a.partials);
  TANDEM_CUDA_CHECK(cudaGetLastError());
  stats_finalize<<<(channels + kFinalizeChannels - 1) / kFinalizeChannels,
                   dim3(kFinalizeChannels, kFinalizeLanes), 0, stream>>>(a, channels, g.splits);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

void check_rows(const BnRows& t) {
  TANDEM_CHECK_ARG(
      t.rows > 0 && t.channels > 0 && t.channels % vector_width(t.dtype) == 0 && aligned16(t.x),
      "the channels-last batch-norm kernels need 16-byte aligned rows of whole "
      "vectors: got ",
      t.channels, " channels");
}

}  // namespace

int bn_row_splits(const BnRows& t) {
  return grid_for(t, kMaxResidentBlocks, std::numeric_limits<int>::max()).splits;
}

int64_t bn_partials_floats(const BnRows& t, int splits) {
  return static_cast<int64_t>(splits) * (2 * t.channels + 1);
}

void launch_bn_stats(const BnStats& a, cudaStream_t stream) {
  check_rows(a.in);
  switch (a.in.dtype) {
    case BnDtype::kFloat:
      launch_stats_typed<float>(a, stream);
      break;
    case BnDtype::kBFloat16:
      launch_stats_typed<__nv_bfloat16>(a, stream);
      break;
    case BnDtype::kHalf:
      launch_stats_typed<__half>(a, stream);
      break;
  }
}

void launch_bn_backward(const BnBackward& a, cudaStream_t stream) {
  check_rows(a.in);
  TANDEM_CHECK_ARG(aligned16(a.grad) && aligned16(a.grad_x) && aligned16(a.grad_residual) &&
                       aligned16(a.grad2) && aligned16(a.grad_sum),
                   "the channels-last batch-norm backward needs 16-byte aligned gradients");
  TANDEM_CHECK_ARG(!a.grad2 == !a.grad_sum,
                   "the batch-norm backward's second gradient needs grad_sum, and only it");
  TANDEM_CHECK_ARG(!a.grad2 || !a.grad_residual,
                   "the batch-norm backward's masked sum of two gradients is the residual's "
                   "gradient: give grad_sum, not grad_residual");
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    if (a.mask)
      launch_backward_typed<T, true>(a, stream);
    else
      launch_backward_typed<T, false>(a, stream);
  };
  switch (a.in.dtype) {
    case BnDtype::kFloat:
      typed(float{});
      break;
    case BnDtype::kBFloat16:
      typed(__nv_bfloat16{});
      break;
    case BnDtype::kHalf:
      typed(__half{});
      break;
  }
}

}  // namespace tandem::models
