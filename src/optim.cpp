// tandem::optim::Sgd: one multi-tensor update per step.
#include "tandem/optim.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "tandem/error.h"

namespace tandem::optim {

Sgd::Sgd(std::vector<at::Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  TANDEM_CHECK_ARG(lr > 0, "learning rate ", lr, " is not valid: expected a positive number");
  for (const auto& p : params_)
    TANDEM_CHECK_ARG(p.requires_grad(), "SGD was given a parameter that does not require grad");
}

void Sgd::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

void Sgd::step() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params, grads;
  params.reserve(params_.size());
  grads.reserve(params_.size());
  for (const auto& p : params_) {
    if (!p.grad().defined()) continue;
    params.push_back(p);
    grads.push_back(p.grad());
  }
  if (!params.empty()) at::_foreach_add_(params, grads, -lr_);
}

}  // namespace tandem::optim
