// A dynamic loss scale whose whole state lives in device tensors, for fp16 training: the loss is
// multiplied by the scale before backward so that small gradients survive fp16's range, the
// gradients are divided by it again (and checked for inf/NaN) before the optimizer's step, and
// the scale backs off after an overflow and grows after a run of clean steps — torch.amp's
// GradScaler's arithmetic (ATen's _amp_foreach_non_finite_check_and_unscale_ and
// _amp_update_scale_), with no host read anywhere: a step captured into a CUDA graph scales,
// checks and updates at every replay as an eager step would. (GradScaler reads found-inf on the
// host to decide whether to call the optimizer at all; here the optimizer skips on the device.)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct LossScaleOptions {
  double init_scale = 65536.0;  ///< 2^16, GradScaler's
  double growth_factor = 2.0;   ///< the scale's factor after growth_interval clean steps
  double backoff_factor = 0.5;  ///< the scale's factor after a step with inf/NaN gradients
  int64_t growth_interval = 2000;
};

class LossScale {
 public:
  /// Throws InvalidArgument for a scale <= 0, a growth factor <= 1, a backoff factor outside
  /// (0, 1) or an interval < 1, naming it.
  explicit LossScale(c10::Device device, LossScaleOptions options = {});

  /// loss * scale, for backward (the loss itself is what a run records).
  at::Tensor scaled(const at::Tensor& loss) const;
  /// Divides each defined gradient of `params` by the scale in place and sets found_inf() to 1
  /// where any of them holds an inf or a NaN (else 0). Current stream; capture-safe.
  void unscale(const std::vector<at::Tensor>& params);
  /// After the step: the scale times backoff_factor where found_inf(), else times growth_factor
  /// once growth_interval steps in a row were clean. Current stream; capture-safe.
  void update();

  /// One float: 1 where the last unscale() found an inf or NaN. An optimizer skips on it.
  const at::Tensor& found_inf() const { return found_inf_; }
  /// The scale now, read on the host (waits for the current stream): between steps only.
  double scale() const;
  /// "scale", "growth_tracker": what a checkpoint keeps.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  /// Copies `state`, named as state() names it, in (current stream): a resumed run continues
  /// the scale. InvalidArgument listing every missing, unknown or misshapen entry (as the
  /// optimizers' load_state); nothing copied then.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  LossScaleOptions options_;
  at::Tensor scale_;           // float [1]
  at::Tensor growth_tracker_;  // int32 [1]: clean steps in a row
  at::Tensor found_inf_;       // float [1]
};

}  // namespace tandem
