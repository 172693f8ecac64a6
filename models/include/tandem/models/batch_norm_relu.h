// Training-mode batch norm, the residual add and ReLU as one autograd op, the way
// torch.compile fuses them: relu(batch_norm(x) (+ residual)) with one pass that writes the
// activation, instead of LibTorch's normalize, add and ReLU passes (each a read and a write of
// the whole activation).
//
// On a GPU in channels-last order (the fast recipe's layout) every pass is tandem's own
// (kernels/bn_relu.cu): one read of x for the statistics, one pass writing y and the ReLU's mask
// as bits, and a backward of one read of the gradient and x for the sums and one more writing
// dL/dx (and the residual's gradient) — the mask replaces a pass over y. Other layouts use
// LibTorch's batch-norm kernels (those SyncBatchNorm uses) around the fused apply. On the CPU,
// and for dtypes the CUDA kernels do not take, the same arithmetic runs as ATen ops (the
// reference the tests hold it to).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <utility>

namespace tandem::models {

/// relu(bn(x) + residual) (residual undefined: relu(bn(x))) for a 4-D x in training mode: batch
/// statistics, `bn`'s running statistics updated with its momentum and num_batches_tracked
/// counted, as torch::nn::BatchNorm2d's forward does. Gradients reach x, bn.weight, bn.bias and
/// the residual. y is computed in float32 (float64 for double input) and rounded once, so in
/// bf16 it differs from the unfused ops (which round after the normalize and after the add) by a
/// rounding step. Runs on the current stream; capture-safe. Throws InvalidArgument for a bn
/// without an affine map, running statistics or a momentum, or an x that is not (N, C, H, W)
/// with bn's C.
///
/// `sums` (optional): x's per-channel Σx and Σx², (2, C) float32 on x's device, as
/// conv2d_with_stats gives them from the convolution that produced x. On the channels-last
/// kernels the statistics are then finalized from them and x is not read for them (the mean
/// and variance from plain float32 sums, as cuDNN's fused graphs give them); elsewhere they are
/// ignored and x is read as without them.
at::Tensor batch_norm_relu(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                           const at::Tensor& residual = at::Tensor(),
                           const at::Tensor& sums = at::Tensor());

/// batch_norm_relu's output returned twice — the same values, one storage (the second a view of
/// the first) — for an output used twice: a ResNet block's output is the next block's first
/// convolution's input and its residual. Autograd would add the two uses' gradients in a pass
/// of their own; here they reach this op's backward apart, and on the channels-last kernels its
/// first pass sums them (rounded once, as that add would) while it reads them for the batch
/// norm's sums, and writes the sum masked by the ReLU — the residual's gradient itself, which
/// the pass writing dL/dx then need not write: the add's pass, one read of its result and one
/// write are saved. Neither output may be modified in place.
std::pair<at::Tensor, at::Tensor> batch_norm_relu_twice(const at::Tensor& x,
                                                        torch::nn::BatchNorm2dImpl& bn,
                                                        const at::Tensor& residual = at::Tensor(),
                                                        const at::Tensor& sums = at::Tensor());

/// bn(x) in training mode through the same kernels, with no ReLU (a ResNet's downsample): the
/// statistics and the backward of batch_norm_relu, the same checks and `sums`.
at::Tensor batch_norm_train(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                            const at::Tensor& sums = at::Tensor());

/// Eval mode's relu(bn(x) + residual) (residual undefined: none; relu false: no ReLU) with bn's
/// running statistics, as one pass through batch_norm_relu's apply kernel where it takes x
/// (else the same arithmetic as ATen ops). Not differentiable: for forwards without gradients
/// (an evaluation), where it runs the training's own kernels — LibTorch's eval-mode batch norm,
/// add and ReLU would be kernels the run's first evaluation launches (and loads) for the first
/// time, and three passes where this is one. y is computed in float32 and rounded once, as
/// batch_norm_relu's. Throws InvalidArgument as batch_norm_relu does, and for an x that
/// requires a gradient.
at::Tensor batch_norm_relu_eval(const at::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                                const at::Tensor& residual = at::Tensor(), bool relu = true);

}  // namespace tandem::models
