// A training step's common kernels loaded ahead (see kernel_warmup.h). Why: CUDA loads a kernel's
// module on its first launch (lazy loading, the default), and LibTorch's modules are large. A
// profile of a second process's first ResNet-18 step on an H100, its plans built ahead, showed
// 6-18 ms before the first launch of each new kind of kernel (batch norm, ReLU, the long add of
// the batch norm's counter, pooling, the loss, the optimizer's foreach updates) and ~100 ms
// before cuBLAS's first matmul: ~0.27 s of the step's 0.31 s. Run on tiny operands beside the
// plans' threads (whose first ~0.1 s is cuDNN's configuration on the CPU), those loads are paid
// off the step's path. The ops are what torchvision's classifiers and tandem's ResNets train
// with; a model that uses none of them loses only what this thread costs beside the plans'.
#include "kernel_warmup.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <vector>

namespace tandem::models::detail {

int64_t run_step_ops(const at::TensorOptions& on, c10::ScalarType dtype, bool channels_last) {
  int64_t ran = 0;
  const auto f32 = on.dtype(at::kFloat);
  const auto layout = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  constexpr int64_t kBatch = 4, kChannels = 64, kSide = 8, kClasses = 10;
  // Constants, not random numbers: the process's generators are the run's.
  at::Tensor x = at::ones({kBatch, kChannels, kSide, kSide}, f32.dtype(dtype)).contiguous(layout);
  x.requires_grad_();
  at::Tensor gamma = at::ones({kChannels}, f32).requires_grad_();
  at::Tensor beta = at::zeros({kChannels}, f32).requires_grad_();
  at::Tensor running_mean = at::zeros({kChannels}, f32);
  at::Tensor running_var = at::ones({kChannels}, f32);
  at::Tensor batches_tracked = at::zeros({}, f32.dtype(at::kLong));
  at::Tensor weight = at::ones({kClasses, kChannels}, f32).requires_grad_();
  at::Tensor bias = at::zeros({kClasses}, f32).requires_grad_();

  // A low-precision activation through float32 batch-norm parameters, as under autocast.
  // Each op counts itself as it returns, so the count follows the list as ops are added (an op
  // that throws ends the sequence: the caller reports 0).
  at::Tensor y = at::batch_norm(x, gamma, beta, running_mean, running_var, /*training=*/true, 0.1,
                                1e-5, /*cudnn_enabled=*/true);
  ++ran;
  batches_tracked.add_(1);
  ++ran;
  y = y.add(x);
  ++ran;
  at::relu_(y);
  ++ran;
  y = at::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  ++ran;
  y = at::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
  ++ran;
  const at::Tensor logits = at::linear(y, weight.to(dtype), bias.to(dtype));
  ++ran;
  const at::Tensor loss = at::cross_entropy_loss(logits, at::zeros({kBatch}, f32.dtype(at::kLong)));
  ++ran;
  torch::autograd::backward({loss});
  ++ran;

  // Momentum SGD's updates as torch.optim.SGD makes them on CUDA (foreach).
  std::vector<at::Tensor> params, grads, buffers;
  for (const at::Tensor& p : {gamma, beta, weight, bias}) {
    params.push_back(p.detach());
    grads.push_back(p.grad());
    buffers.push_back(at::zeros_like(p));
  }
  const std::vector<at::Tensor> decayed = at::_foreach_add(grads, params, 1e-4);
  ++ran;
  at::_foreach_mul_(buffers, 0.9);
  ++ran;
  at::_foreach_add_(buffers, decayed, 1.0);
  ++ran;
  at::_foreach_add_(params, buffers, -0.1);
  ++ran;
  return ran;
}

int64_t warm_step_kernels(int device, c10::ScalarType dtype, bool channels_last) {
  try {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
    // A stream of its own: nothing of the step's waits for this, nor this for the step.
    const c10::cuda::CUDAStream stream =
        c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    c10::cuda::CUDAStreamGuard on_stream(stream);
    const int64_t ran =
        run_step_ops(at::TensorOptions().device(at::kCUDA, device), dtype, channels_last);
    stream.synchronize();
    return ran;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace tandem::models::detail
