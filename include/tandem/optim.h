// tandem's optimizers. Sgd: plain SGD as one multi-tensor `_foreach_add_` per step (in a
// launch-bound step the host cost of the update matters). Adam/AdamW: capturable — the step
// count, bias corrections and learning rate live in device tensors, so a step captured into a
// CUDA graph applies at every replay exactly what an eager step would. (LibTorch's
// torch::optim::Adam keeps the step count on the host and computes the bias corrections with
// std::pow when the step is *captured*: every replay then repeats the first step's corrections.)
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tandem::optim {

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
};

/// SGD with torch::optim::SGD's update: d = grad (+ weight_decay * p); with momentum,
/// buf = d on a parameter's first step, then buf = momentum * buf + (1 - dampening) * d, and
/// d = nesterov ? d + momentum * buf : buf; finally p -= lr * d. Without momentum and weight
/// decay the whole update is one multi-tensor `_foreach_add_`. Runs on the current stream, no
/// host sync; capture-safe once every momentum buffer exists (after one eager step: warm-up).
class Sgd {
 public:
  Sgd(std::vector<at::Tensor> params, double lr);
  Sgd(std::vector<at::Tensor> params, SgdOptions options);

  /// Sets every gradient to undefined ("set to none"), so backward writes fresh ones instead of
  /// accumulating: no zeroing kernels.
  void zero_grad();
  void step();

  double lr() const { return options_.lr; }

 private:
  std::vector<at::Tensor> params_;
  SgdOptions options_;
  std::vector<at::Tensor> momentum_buffers_;  // undefined until a parameter's first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  /// false: Adam (weight decay added to the gradient); true: AdamW (decoupled: p *= 1 - lr*wd).
  bool decoupled_weight_decay = false;
};

/// Adam / AdamW with all state on the parameters' device. step() is capture-safe once every
/// parameter has a gradient (the state is created at construction, not at the first step).
class Adam {
 public:
  Adam(std::vector<at::Tensor> params, AdamOptions options);

  void zero_grad();
  void step();
  /// Enqueues an update of the learning-rate tensor on the current stream: replays of a graph
  /// captured earlier use the new value (a schedule that works under replay).
  void set_lr(double lr);
  const at::Tensor& lr() const { return lr_; }     ///< 0-dim float32 on the device
  const at::Tensor& steps() const { return step_; }  ///< 0-dim float32: steps taken

 private:
  std::vector<at::Tensor> params_;
  AdamOptions options_;
  at::Tensor lr_, step_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

/// AdamW: Adam with decoupled weight decay (default 1e-2, as torch.optim.AdamW).
inline Adam make_adamw(std::vector<at::Tensor> params, AdamOptions options = {1e-3, 0.9, 0.999,
                                                                              1e-8, 1e-2, true}) {
  options.decoupled_weight_decay = true;
  return Adam(std::move(params), options);
}

}  // namespace tandem::optim
