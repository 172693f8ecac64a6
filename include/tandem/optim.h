// tandem's optimizers. Today: plain SGD (no momentum), whose step is one multi-tensor
// `_foreach_add_` over all parameters instead of one kernel launch per parameter, because in a
// launch-bound training step the host cost of the update matters. Captured into graphs later.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tandem::optim {

/// p <- p - lr * grad(p) for every parameter with a gradient: the update of
/// torch::optim::SGD(params, lr) without momentum, dampening or weight decay.
/// Runs on the current stream; no host sync.
class Sgd {
 public:
  Sgd(std::vector<at::Tensor> params, double lr);

  /// Sets every gradient to undefined ("set to none"), so backward writes fresh ones instead of
  /// accumulating: no zeroing kernels.
  void zero_grad();
  void step();

  double lr() const { return lr_; }

 private:
  std::vector<at::Tensor> params_;
  double lr_;
};

}  // namespace tandem::optim
