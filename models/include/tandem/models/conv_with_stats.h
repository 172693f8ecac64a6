// A convolution that also gives the per-channel sum and sum of squares of its output — what
// the training-mode batch norm after it needs — from the convolution's own epilogue, where
// cuDNN's graph API has an engine for it (half, channels-last: the "genstats" fusion NVIDIA's
// ResNet-50 trains with). The batch norm then finalizes those sums instead of reading the whole
// activation again (batch_norm_relu's `sums`). Elsewhere it is the plain convolution and no sums,
// and the batch norm reads its input as before.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace tandem::models {

struct ConvAndSums {
  at::Tensor y;     ///< conv2d(x, weight): differentiable in x and weight
  at::Tensor sums;  ///< (2, K) float32: Σy and Σy² per channel over N·H·W; undefined if not fused
};

/// conv2d(x, weight, no bias, stride, padding) for a 4-D x and (K, C, R, S) weight (dilation 1,
/// one group), with its output's sums where one cuDNN graph computes both: CUDA half tensors in
/// channels-last order, cuDNN enabled, deterministic algorithms not requested (the epilogue's
/// reduction order varies between runs on some shapes: the sums are not the same bits every
/// run), and an engine for the shape on this GPU (a shape without one is said once on stderr and
/// runs unfused from then on). The sums are not differentiable: a batch norm's backward accounts
/// for its statistics itself. The gradients are LibTorch's convolution backward's (or the kept
/// plans', below). Runs on the current stream; capture-safe once a shape has run eagerly (its
/// graph is built on first use).
/// `input_nonnegative`: x is a ReLU's output (every ResNet convolution's but the stem's), which
/// lets a form of the graph with a ReLU before the convolution stand in where cuDNN has an
/// engine only for that form; the values are the same. Not checked: a false claim changes y.
/// `kept_plans`: the fused graph's gradients run on tuned_conv2d's kept plans
/// (tuned_conv2d_backward), timed once for the process, instead of LibTorch's backward, which
/// times cuDNN's candidates again on every thread.
ConvAndSums conv2d_with_stats(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                              at::IntArrayRef padding, bool input_nonnegative = false,
                              bool kept_plans = false);

/// Whether this build has cuDNN's graph API (conv2d_with_stats never fuses without it).
bool conv_with_stats_compiled();

/// Whether conv2d_with_stats tries its fused graph for these operands (dtypes, layout, device,
/// cuDNN's settings, this build); where not, it is at::conv2d without sums.
bool conv2d_with_stats_applies(const at::Tensor& x, const at::Tensor& weight);

}  // namespace tandem::models
