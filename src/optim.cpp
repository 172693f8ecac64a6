// tandem::optim: Sgd and Adam with their learning rate (and Adam's step count) in device
// tensors, and the learning-rate schedules that set them between replays.
#include "tandem/optim.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "tandem/detail/laid_out_like.h"
#include "tandem/detail/saved_state.h"
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
  const c10::Device device = params_.empty() ? c10::Device(c10::kCPU) : params_[0].device();
  for (const auto& p : params_) {
    TANDEM_CHECK_ARG(p.requires_grad(), "SGD was given a parameter that does not require grad");
    // The lr tensor lives on one device, and a CUDA kernel cannot read another GPU's lr.
    TANDEM_CHECK_ARG(p.device() == device, "SGD was given parameters on ", device, " and on ",
                     p.device(), ": expected one device");
  }
  lr_ = at::full({}, options.lr, at::TensorOptions().dtype(at::kFloat).device(device));
  momentum_buffers_.resize(params_.size());
}

void Sgd::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

void Sgd::set_lr(double lr) {
  TANDEM_CHECK_ARG(lr >= 0, "learning rate ", lr, " is not valid: expected >= 0");
  lr_.fill_(lr);
}

double Sgd::learning_rate() const { return lr_.item<double>(); }

namespace {
using tandem::detail::laid_out_like;

// The parameters one step updates with one call, their gradients and (with momentum) their
// momentum buffers, index-aligned.
struct SgdLists {
  std::vector<at::Tensor> params, grads, buffers;
};

// Whether LibTorch's fused multi-tensor kernels (_fused_sgd_, _fused_adam_, _fused_adamw_) take
// these lists: their CUDA kernels check (and their CPU kernels assume) one floating dtype and one
// device, dense tensors, and every tensor of `like_params` laid out like its parameter. Stricter
// than LibTorch's own check (strides of size-1 dimensions must match too): a list it would take
// that this refuses only takes the slow path.
bool fused_kernel_takes(const std::vector<at::Tensor>& params,
                        std::initializer_list<const std::vector<at::Tensor>*> like_params) {
  if (params.empty()) return false;
  const at::ScalarType dtype = params[0].scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16)
    return false;
  const c10::Device device = params[0].device();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    auto like_p = [&](const at::Tensor& t) {
      return t.scalar_type() == dtype && t.device() == device && t.layout() == at::kStrided &&
             t.sizes() == p.sizes() && t.strides() == p.strides();
    };
    if (!p.is_non_overlapping_and_dense() || !like_p(p)) return false;
    for (const auto* list : like_params)
      if (!list->empty() && !like_p((*list)[i])) return false;
  }
  return true;
}

// `found_inf` as the fused kernels take it: none where it is undefined (no step is skipped).
std::optional<at::Tensor> skip_flag(const at::Tensor& found_inf) {
  return found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
}

// One SGD update of the lists, p -= lr * d, with lr read from the device tensor `lr` (a host lr
// would be baked into a captured graph). `first_step`: the buffers were just made and are set
// to d, not decayed.
// Returns whether it ran as the fused kernel (none: true).
// `found_inf` (defined): the update is skipped on the device where it is nonzero.
bool sgd_update(const SgdLists& l, const SgdOptions& o, const at::Tensor& lr, bool first_step,
                const at::Tensor& found_inf) {
  if (l.params.empty()) return true;
  if (o.fused && fused_kernel_takes(l.params, {&l.grads, &l.buffers})) {
    // One multi-tensor kernel for the whole update (weight decay, momentum, nesterov, p -= lr*d),
    // reading lr from device memory; with found_inf it returns early where that is set.
    at::_fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay, o.momentum, lr, o.dampening,
                    o.nesterov, /*maximize=*/false, first_step, /*grad_scale=*/std::nullopt,
                    skip_flag(found_inf));
    return true;
  }
  // Mixed dtypes or layouts: the same update, op by op. With found_inf, every write selects the
  // old value where it is set (a where, not a multiply: an overflowed update is inf or NaN).
  const at::Tensor skip = found_inf.defined() ? found_inf.gt(0).squeeze() : at::Tensor();
  auto unless_skipped = [&](const at::Tensor& now, const at::Tensor& updated) {
    return skip.defined() ? at::where(skip, now, updated) : updated;
  };
  std::vector<at::Tensor> updates;
  updates.reserve(l.params.size());
  for (size_t i = 0; i < l.params.size(); ++i) {
    at::Tensor d = l.grads[i];
    if (o.weight_decay != 0) d = d.add(l.params[i], o.weight_decay);
    if (o.momentum != 0) {
      const at::Tensor& buf = l.buffers[i];
      const at::Tensor next = first_step ? d : buf.mul(o.momentum).add_(d, 1 - o.dampening);
      buf.copy_(unless_skipped(buf, next));
      d = o.nesterov ? d.add(next, o.momentum) : next;
    }
    updates.push_back(skip.defined() ? unless_skipped(at::zeros_like(d), d) : std::move(d));
  }
  // No multi-tensor op takes a device scalar as alpha: d * lr into fresh tensors (gradients and
  // buffers must not change), then p -= that.
  at::_foreach_sub_(l.params, at::_foreach_mul(updates, lr));
  return false;
}

}  // namespace

void Sgd::step() {
  at::NoGradGuard no_grad;
  const bool momentum = options_.momentum != 0;
  // Parameters whose momentum buffer this step creates take a separate call (first_step): in
  // eager steps only, since capture comes after a warm-up step made every buffer.
  SgdLists later, first;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor& buf = momentum_buffers_[i];
    const bool new_buffer = momentum && !buf.defined();
    // A first step writes it without reading it, unless that step may be skipped: then the
    // next step reads it (zeros: see skip_steps_where).
    if (new_buffer) buf = found_inf_.defined() ? at::zeros_like(p) : at::empty_like(p);
    SgdLists& l = new_buffer ? first : later;
    l.params.push_back(p);
    l.grads.push_back(laid_out_like(p.grad(), p));
    if (momentum) l.buffers.push_back(buf);
  }
  const bool first_fused = sgd_update(first, options_, lr_, /*first_step=*/true, found_inf_);
  fused_last_step_ =
      sgd_update(later, options_, lr_, /*first_step=*/false, found_inf_) && first_fused;
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions options)
    : params_(std::move(params)), options_(options) {
  TANDEM_CHECK_ARG(!params_.empty(), "Adam was given no parameters");
  TANDEM_CHECK_ARG(options.lr > 0, "learning rate ", options.lr, " is not valid: expected > 0");
  TANDEM_CHECK_ARG(
      options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1, "betas (",
      options.beta1, ", ", options.beta2, ") are not valid: expected [0, 1)");
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
  TANDEM_CHECK_ARG(lr >= 0, "learning rate ", lr, " is not valid: expected >= 0");
  lr_.fill_(lr);
}

double Adam::learning_rate() const { return lr_.item<double>(); }

void Adam::step() {
  at::NoGradGuard no_grad;
  if (found_inf_.defined())
    step_.add_(1 - found_inf_.squeeze());  // a skipped step does not count
  else
    step_.add_(1);
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    params.push_back(params_[i]);
    grads.push_back(laid_out_like(params_[i].grad(), params_[i]));
    exp_avg.push_back(exp_avg_[i]);
    exp_avg_sq.push_back(exp_avg_sq_[i]);
  }
  if (params.empty()) {  // nothing to update, nothing op by op: as Sgd's empty lists
    fused_last_step_ = true;
    return;
  }
  const double b1 = options_.beta1, b2 = options_.beta2, wd = options_.weight_decay;
  fused_last_step_ = options_.fused && fused_kernel_takes(params, {&grads, &exp_avg, &exp_avg_sq});
  if (fused_last_step_) {
    // One multi-tensor kernel for the whole update, reading lr and the step count from device
    // memory (every parameter shares the one step count: the kernel only reads it).
    const std::vector<at::Tensor> steps(params.size(), step_);
    const std::optional<at::Tensor> found = skip_flag(found_inf_);
    if (options_.decoupled_weight_decay)
      at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, {}, steps, lr_, b1, b2, wd,
                        options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                        /*grad_scale=*/std::nullopt, found);
    else
      at::_fused_adam_(params, grads, exp_avg, exp_avg_sq, {}, steps, lr_, b1, b2, wd, options_.eps,
                       /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, found);
    return;
  }
  // The reference: the same update op by op. Everything that depends on the step count is a
  // device tensor: no host value to bake into a captured graph.
  const at::Tensor bias_correction1 = 1 - at::pow(b1, step_);
  const at::Tensor bias_correction2_sqrt = (1 - at::pow(b2, step_)).sqrt();
  const at::Tensor step_size = lr_ / bias_correction1;
  // With found_inf the same ops run on copies, and each write selects the old value where it is
  // set (a where, not a multiply: an overflowed update is inf or NaN).
  const at::Tensor skip = found_inf_.defined() ? found_inf_.gt(0).squeeze() : at::Tensor();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = skip.defined() ? params[i].clone() : params[i];
    at::Tensor m = skip.defined() ? exp_avg[i].clone() : exp_avg[i];
    at::Tensor v = skip.defined() ? exp_avg_sq[i].clone() : exp_avg_sq[i];
    at::Tensor grad = grads[i];
    if (wd != 0) {
      if (options_.decoupled_weight_decay)
        p.mul_(1 - lr_ * wd);
      else
        grad = grad.add(p, wd);
    }
    m.mul_(b1).add_(grad, 1 - b1);
    v.mul_(b2).addcmul_(grad, grad, 1 - b2);
    const at::Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    p.sub_(m / denom * step_size);
    if (!skip.defined()) continue;
    params[i].copy_(at::where(skip, params[i], p));
    exp_avg[i].copy_(at::where(skip, exp_avg[i], m));
    exp_avg_sq[i].copy_(at::where(skip, exp_avg_sq[i], v));
  }
}

namespace {

constexpr double kPi = 3.14159265358979323846;

void check_step(int64_t step) {
  TANDEM_CHECK_ARG(step >= 0, "learning-rate schedule asked for step ", step, ": expected >= 0");
}

}  // namespace

LrSchedule constant_lr(double lr) {
  TANDEM_CHECK_ARG(lr >= 0, "learning rate ", lr, " is not valid: expected >= 0");
  return [lr](int64_t step) {
    check_step(step);
    return lr;
  };
}

LrSchedule step_decay(double lr, int64_t step_size, double gamma) {
  TANDEM_CHECK_ARG(lr >= 0, "learning rate ", lr, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(step_size > 0, "step decay step_size ", step_size,
                   " is not valid: expected > 0");
  TANDEM_CHECK_ARG(gamma >= 0, "step decay gamma ", gamma, " is not valid: expected >= 0");
  return [=](int64_t step) {
    check_step(step);
    return lr * std::pow(gamma, static_cast<double>(step / step_size));
  };
}

LrSchedule cosine(double lr, int64_t total_steps, double min_lr) {
  TANDEM_CHECK_ARG(lr >= 0, "learning rate ", lr, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(total_steps > 0, "cosine schedule total_steps ", total_steps,
                   " is not valid: expected > 0");
  TANDEM_CHECK_ARG(min_lr >= 0 && min_lr <= lr, "cosine schedule min_lr ", min_lr,
                   " is not valid: expected in [0, ", lr, "]");
  return [=](int64_t step) {
    check_step(step);
    if (step >= total_steps) return min_lr;
    const double t = static_cast<double>(step) / static_cast<double>(total_steps);
    return min_lr + (lr - min_lr) * (1 + std::cos(kPi * t)) / 2;
  };
}

LrSchedule linear_warmup(int64_t warmup_steps, LrSchedule after) {
  TANDEM_CHECK_ARG(warmup_steps >= 0, "warm-up steps ", warmup_steps,
                   " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(static_cast<bool>(after), "linear_warmup was given an empty schedule");
  return [warmup_steps, after = std::move(after)](int64_t step) {
    check_step(step);
    if (step >= warmup_steps) return after(step - warmup_steps);
    return after(0) * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  };
}

void Optimizer::set_lr(double) {
  TANDEM_CHECK_ARG(false, name(),
                   " takes no learning-rate schedule: expected tandem::optim::Sgd, "
                   "Adam or AdamW");
}

double Optimizer::learning_rate() const { return std::nan(""); }

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state() const {
  TANDEM_CHECK_ARG(false, name(),
                   " cannot be checkpointed: expected tandem::optim::Sgd, Adam "
                   "or AdamW");
  return {};
}

void Optimizer::load_state(const std::vector<std::pair<std::string, at::Tensor>>&) {
  TANDEM_CHECK_ARG(false, name(),
                   " cannot be restored from a checkpoint: expected "
                   "tandem::optim::Sgd, Adam or AdamW");
}

void Optimizer::skip_steps_where(const at::Tensor&) {
  TANDEM_CHECK_ARG(false, name(),
                   " cannot skip a step on the device (loss scaling): expected "
                   "tandem::optim::Sgd, Adam or AdamW");
}

namespace {
// `found_inf` checked as one float on the parameters' device.
at::Tensor checked_found_inf(const at::Tensor& found_inf, const std::vector<at::Tensor>& params,
                             const std::string& who) {
  TANDEM_CHECK_ARG(
      found_inf.defined() && found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat, who,
      ": the skip flag must be one float32 (LossScale::found_inf())");
  TANDEM_CHECK_ARG(params.empty() || found_inf.device() == params[0].device(), who,
                   ": the skip flag is on ", found_inf.device(), ", the parameters on ",
                   params[0].device(), ": expected one device");
  return found_inf;
}
}  // namespace

void Sgd::skip_steps_where(const at::Tensor& found_inf) {
  found_inf_ = checked_found_inf(found_inf, params_, name());
}

void Adam::skip_steps_where(const at::Tensor& found_inf) {
  found_inf_ = checked_found_inf(found_inf, params_, name());
}

std::vector<std::pair<std::string, at::Tensor>> Sgd::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out{{"lr", lr_}};
  for (size_t i = 0; i < momentum_buffers_.size(); ++i)
    if (momentum_buffers_[i].defined())
      out.emplace_back("momentum_buffer." + std::to_string(i), momentum_buffers_[i]);
  return out;
}

void Sgd::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  // Buffers the state names are made here (a parameter without one had no step yet).
  std::map<std::string, at::Tensor> expected{{"lr", lr_}};
  std::vector<at::Tensor> made = momentum_buffers_;
  if (options_.momentum != 0)
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!made[i].defined()) made[i] = at::zeros_like(params_[i]);
      expected["momentum_buffer." + std::to_string(i)] = made[i];
    }
  tandem::detail::copy_saved_state(name(), state, expected, [](const std::string& n) {
    return n.rfind("momentum_buffer.", 0) == 0;
  });
  for (size_t i = 0; i < made.size(); ++i) {
    const std::string key = "momentum_buffer." + std::to_string(i);
    const bool named =
        std::any_of(state.begin(), state.end(), [&](const auto& e) { return e.first == key; });
    momentum_buffers_[i] = named ? made[i] : at::Tensor();
  }
}

std::vector<std::pair<std::string, at::Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out{{"lr", lr_}, {"step", step_}};
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + std::to_string(i), exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + std::to_string(i), exp_avg_sq_[i]);
  }
  return out;
}

void Adam::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> expected;
  for (const auto& [name, t] : this->state()) expected[name] = t;
  tandem::detail::copy_saved_state(name(), state, expected,
                                   [](const std::string&) { return false; });
}

}  // namespace tandem::optim
