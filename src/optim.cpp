// tandem::optim::Sgd: one multi-tensor update per step.
#include "tandem/optim.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "tandem/error.h"

namespace tandem::optim {

Sgd::Sgd(std::vector<at::Tensor> params, double lr) : Sgd(std::move(params), SgdOptions{lr}) {}

Sgd::Sgd(std::vector<at::Tensor> params, SgdOptions options)
    : params_(std::move(params)), options_(options) {
  TANDEM_CHECK_ARG(options.lr > 0, "learning rate ", options.lr,
                   " is not valid: expected a positive number");
  TANDEM_CHECK_ARG(options.momentum >= 0, "momentum ", options.momentum,
                   " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(options.weight_decay >= 0, "weight decay ", options.weight_decay,
                   " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
                   "nesterov momentum needs momentum > 0 and dampening 0");
  for (const auto& p : params_)
    TANDEM_CHECK_ARG(p.requires_grad(), "SGD was given a parameter that does not require grad");
  momentum_buffers_.resize(params_.size());
}

void Sgd::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

void Sgd::step() {
  at::NoGradGuard no_grad;
  const double lr = options_.lr, m = options_.momentum, wd = options_.weight_decay;
  if (m == 0 && wd == 0) {
    std::vector<at::Tensor> params, grads;
    params.reserve(params_.size());
    grads.reserve(params_.size());
    for (const auto& p : params_) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (!params.empty()) at::_foreach_add_(params, grads, -lr);
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor d = p.grad();
    if (wd != 0) d = d.add(p, wd);
    if (m != 0) {
      at::Tensor& buf = momentum_buffers_[i];
      if (!buf.defined())
        buf = d.clone();
      else
        buf.mul_(m).add_(d, 1 - options_.dampening);
      d = options_.nesterov ? d.add(buf, m) : buf;
    }
    p.add_(d, -lr);
  }
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions options)
    : params_(std::move(params)), options_(options) {
  TANDEM_CHECK_ARG(!params_.empty(), "Adam was given no parameters");
  TANDEM_CHECK_ARG(options.lr > 0, "learning rate ", options.lr, " is not valid: expected > 0");
  TANDEM_CHECK_ARG(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                       options.beta2 < 1,
                   "betas (", options.beta1, ", ", options.beta2, ") are not valid: expected [0, 1)");
  TANDEM_CHECK_ARG(options.eps > 0, "eps ", options.eps, " is not valid: expected > 0");
  TANDEM_CHECK_ARG(options.weight_decay >= 0, "weight decay ", options.weight_decay,
                   " is not valid: expected >= 0");
  const auto scalar = at::TensorOptions().dtype(at::kFloat).device(params_[0].device());
  lr_ = at::full({}, options.lr, scalar);
  step_ = at::zeros({}, scalar);
  for (const auto& p : params_) {
    TANDEM_CHECK_ARG(p.requires_grad(), "Adam was given a parameter that does not require grad");
    exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
  }
}

void Adam::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

void Adam::set_lr(double lr) {
  TANDEM_CHECK_ARG(lr > 0, "learning rate ", lr, " is not valid: expected > 0");
  lr_.fill_(lr);
}

void Adam::step() {
  at::NoGradGuard no_grad;
  const double b1 = options_.beta1, b2 = options_.beta2, wd = options_.weight_decay;
  step_.add_(1);
  // Everything that depends on the step count is a device tensor: no host value to bake in.
  const at::Tensor bias_correction1 = 1 - at::pow(b1, step_);
  const at::Tensor bias_correction2_sqrt = (1 - at::pow(b2, step_)).sqrt();
  const at::Tensor step_size = lr_ / bias_correction1;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor grad = p.grad();
    if (wd != 0) {
      if (options_.decoupled_weight_decay)
        p.mul_(1 - lr_ * wd);
      else
        grad = grad.add(p, wd);
    }
    exp_avg_[i].mul_(b1).add_(grad, 1 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(grad, grad, 1 - b2);
    const at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(options_.eps);
    p.sub_(exp_avg_[i] / denom * step_size);
  }
}

}  // namespace tandem::optim
