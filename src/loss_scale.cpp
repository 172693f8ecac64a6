// LossScale: see loss_scale.h.
#include "tandem/loss_scale.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "tandem/detail/saved_state.h"
#include "tandem/error.h"

namespace tandem {

LossScale::LossScale(c10::Device device, LossScaleOptions options) : options_(options) {
  TANDEM_CHECK_ARG(options.init_scale > 0, "loss scale ", options.init_scale,
                   " is not valid: expected > 0");
  TANDEM_CHECK_ARG(options.growth_factor > 1, "loss-scale growth factor ", options.growth_factor,
                   " is not valid: expected > 1");
  TANDEM_CHECK_ARG(options.backoff_factor > 0 && options.backoff_factor < 1,
                   "loss-scale backoff factor ", options.backoff_factor,
                   " is not valid: expected a number in (0, 1)");
  TANDEM_CHECK_ARG(options.growth_interval >= 1, "loss-scale growth interval ",
                   options.growth_interval, " is not valid: expected >= 1 step");
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({1}, options.init_scale, f32);
  growth_tracker_ = at::zeros({1}, f32.dtype(at::kInt));
  found_inf_ = at::zeros({1}, f32);
}

at::Tensor LossScale::scaled(const at::Tensor& loss) const {
  return loss * scale_.to(loss.scalar_type()).squeeze();
}

void LossScale::unscale(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  found_inf_.zero_();
  if (grads.empty()) return;
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
}

void LossScale::update() {
  at::NoGradGuard no_grad;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
}

double LossScale::scale() const { return scale_.item<double>(); }

std::vector<std::pair<std::string, at::Tensor>> LossScale::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}};
}

void LossScale::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  const auto mine = this->state();
  detail::copy_saved_state("loss scale", state, {mine.begin(), mine.end()},
                           [](const std::string&) { return false; });
}

}  // namespace tandem
