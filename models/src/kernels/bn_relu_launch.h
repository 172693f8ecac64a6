// The launchers of the fused batch-norm kernels (bn_relu.cu): plain pointers, no LibTorch types,
// so bn_relu.cu compiles without LibTorch's headers.
//
// Two families:
//  - the apply (any layout the caller makes contiguous: NCHW or channels-last), used by every
//    CUDA path;
//  - the channels-last training path, where a (N, C, H, W) tensor is `rows` = N*H*W rows of C
//    channels, read in 16-byte vectors of one row: statistics, backward reduction and backward
//    elementwise pass, each thread owning one vector's channels over a strided set of rows so its
//    per-channel constants stay in registers. Reductions write per-split partials and a second,
//    small kernel combines them in a fixed order: results are the same on every run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::models {

enum class BnDtype { kFloat, kBFloat16, kHalf };

/// Elements per 16-byte vector: 4 for float, 8 for bfloat16 and half.
int bn_vector_width(BnDtype dtype);

struct BnApplyRelu {
  const void* x;         // (N, C, H, W) of `dtype`, contiguous in NCHW or in channels-last order
  const void* residual;  // null, or laid out and typed as x
  const float* scale;    // (C,) float32: weight * invstd
  const float* shift;    // (C,) float32: bias - mean * weight * invstd
  void* y;               // laid out and typed as x
  int64_t numel, channels, spatial;  // N*C*H*W, C, H*W
  bool channels_last;
  BnDtype dtype;
  bool relu = true;
  /// If set (vector path only: bn_apply_writes_mask): one byte per 16-byte vector of y, bit k set
  /// where element k of the vector is > 0 — the ReLU's mask for the backward, 1/8 or 1/4 of a
  /// pass instead of reading y again.
  uint8_t* mask = nullptr;
};

/// Whether launch_bn_apply_relu takes the 16-byte-vector path for `a` (and so can write a mask).
bool bn_apply_vectorized(const BnApplyRelu& a);

/// y = relu(x * scale[c] + shift[c] (+ residual)) (no relu when a.relu is false) in float32,
/// rounded once to the dtype, on `stream`. NaN stays NaN, as torch.relu. Checks the launch.
/// Capture-safe.
void launch_bn_apply_relu(const BnApplyRelu& args, cudaStream_t stream);

/// A channels-last tensor as rows of channels, and the grid the reductions over it use.
struct BnRows {
  const void* x;           // rows * channels elements of dtype, 16-byte aligned
  int64_t rows, channels;  // channels: a multiple of bn_vector_width(dtype)
  BnDtype dtype;
};

/// How many row splits the channels-last reductions use for this shape on the current device:
/// the partial workspaces hold bn_partials_floats(rows, splits) floats.
int bn_row_splits(const BnRows& t);
int64_t bn_partials_floats(const BnRows& t, int splits);

struct BnStats {
  BnRows in;
  int splits;
  float* partials;  // bn_partials_floats
  // Affine map and running statistics, (C,) float32; running ones may be null (none kept).
  const float* weight;
  const float* bias;
  float* running_mean;
  float* running_var;    // updated with the unbiased variance, as BatchNorm2d
  int64_t* num_batches;  // incremented by one, or null
  float momentum, eps;
  // Outputs, (C,) float32.
  float* mean;
  float* invstd;
  float* scale;  // weight * invstd
  float* shift;  // bias - mean * scale
  /// If set: (2, C) float32, Σx and Σx² over the rows, already computed (a convolution's
  /// epilogue: conv2d_with_stats). The finalize takes the statistics from them and nothing
  /// reads x; partials and splits are unused.
  const float* sums = nullptr;
};

/// Batch mean and 1/sqrt(biased variance + eps) per channel (shifted sums per thread, Chan's
/// combination across threads and splits), then the scale and shift for the apply and the
/// running-statistics update: two kernels on `stream` (one, the finalize, where args.sums are
/// given).
void launch_bn_stats(const BnStats& args, cudaStream_t stream);

struct BnBackward {
  BnRows in;            // x, the batch norm's input
  const void* grad;     // dL/dy, laid out and typed as x
  const uint8_t* mask;  // the apply's mask (y > 0), or null: no ReLU
  const float* mean;    // the forward's
  const float* invstd;
  const float* weight;
  int splits;
  float* partials;      // bn_partials_floats
  float* coefficients;  // 3 * C floats of workspace
  // Outputs, each may be null (not wanted).
  float* grad_weight;   // (C,) float32
  float* grad_bias;     // (C,) float32
  void* grad_x;         // laid out and typed as x
  void* grad_residual;  // the masked dL/dy (the residual's gradient), laid out and typed as x
  /// y used twice (batch_norm_relu_twice): the second use's dL/dy, laid out and typed as x, or
  /// null. The sums' pass reads both and writes their sum (rounded once, as autograd's add
  /// would), masked, to grad_sum, and the pass writing dL/dx reads that: the add's pass and one
  /// read of its result saved. grad_sum is then the residual's gradient too: grad_residual must
  /// be null (that pass writes it only from a single gradient).
  const void* grad2 = nullptr;
  void* grad_sum = nullptr;
};

/// The batch norm's (and ReLU's) backward in three kernels on `stream`: per-channel sums of the
/// masked gradient (grad, or grad + grad2, masked, written to grad_sum) and of it times
/// (x - mean), their combination into the weight and bias gradients and the input gradient's
/// coefficients, and one pass writing dL/dx (and, from a single gradient, the masked gradient
/// for the residual).
void launch_bn_backward(const BnBackward& args, cudaStream_t stream);

}  // namespace tandem::models
