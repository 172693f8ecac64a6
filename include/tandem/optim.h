// tandem's optimizers, capturable: every value a step reads that may change between steps (the
// learning rate; Adam's step count and bias corrections) lives in a device tensor, so a step
// captured into a CUDA graph applies at every replay exactly what an eager step would, and a
// learning-rate schedule set between replays takes effect. (LibTorch's torch::optim::SGD bakes
// the host lr into the captured kernels; torch::optim::Adam also keeps its step count on the host
// and computes the bias corrections with std::pow when the step is *captured*: every replay then
// repeats the first step's corrections.) Sgd's whole step is one multi-tensor kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::optim {

/// What a train stage needs of an optimizer (workload.h): the runner calls zero_grad() before
/// the forward pass and step() after backward, on the train stage's lane. tandem's Sgd and Adam
/// are capturable; LibTorchOptimizer (torch_optimizer.h) wraps LibTorch's, for eager modes only.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Drops (or zeroes) every gradient before the next backward.
  virtual void zero_grad() = 0;
  /// Applies one update on the current stream.
  virtual void step() = 0;
  /// Whether step() may be captured into a CUDA graph: no host-side state that changes between
  /// steps, no host sync. The graphed modes refuse a train stage whose optimizer is not.
  virtual bool capturable() const = 0;
  /// For messages: "tandem::optim::Sgd", ...
  virtual std::string name() const = 0;
  /// The tensors step() updates (data parallel averages their gradients and broadcasts them).
  virtual std::vector<at::Tensor> parameters() const = 0;

  /// Enqueues a change of the learning rate on the current stream (see the schedules below).
  /// The default throws InvalidArgument: the optimizer takes no schedule.
  virtual void set_lr(double lr);
  /// The learning rate the next step() applies (the first param group's), read on the host for
  /// records: between steps, never inside a capture (tandem's read their device tensor, which
  /// waits for the current stream). The default: NaN, the optimizer cannot say.
  virtual double learning_rate() const;
  /// What step() reads besides the parameters and their gradients, as named live tensors, for
  /// checkpoints (the learning rate, step counts, moments). The default throws InvalidArgument:
  /// the optimizer cannot be checkpointed.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() const;
  /// Copies `state`, named as state() names it, into this optimizer on the current stream.
  /// Checks everything first: InvalidArgument listing every unexpected name, missing name and
  /// shape that differs; nothing is copied then.
  virtual void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);
  /// From now on, each step() leaves the parameters and the optimizer's state as they were where
  /// `found_inf` (one float on the parameters' device: LossScale::found_inf()) is nonzero when
  /// the step runs — decided on the device, so a captured step skips exactly the replays whose
  /// gradients overflowed. The default throws InvalidArgument: the optimizer cannot skip on the
  /// device.
  virtual void skip_steps_where(const at::Tensor& found_inf);
};

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
  /// true: one fused multi-tensor kernel where LibTorch has one for these parameters; false:
  /// the same update op by op (the reference the fused path is tested against).
  bool fused = true;
};

/// SGD with torch::optim::SGD's update: d = grad (+ weight_decay * p); with momentum,
/// buf = d on a parameter's first step, then buf = momentum * buf + (1 - dampening) * d, and
/// d = nesterov ? d + momentum * buf : buf; finally p -= lr * d, with lr read from the device
/// tensor lr(). The whole update, momentum and weight decay included, is one call of LibTorch's
/// fused SGD kernel (`at::_fused_sgd_`, multi-tensor, lr taken as a device tensor) when the
/// parameters share one floating dtype and each gradient is laid out like its parameter (strides
/// of size-1 dimensions aside);
/// otherwise the same update runs op by op (a few ops per parameter, then two multi-tensor ops).
/// Runs on the current stream, no host sync; capture-safe once every momentum buffer exists
/// (after one eager step: warm-up). Parameters must share one device (the lr tensor's).
class Sgd : public Optimizer {
 public:
  Sgd(std::vector<at::Tensor> params, double lr);
  Sgd(std::vector<at::Tensor> params, SgdOptions options);

  /// Sets every gradient to undefined ("set to none"), so backward writes fresh ones instead of
  /// accumulating: no zeroing kernels.
  void zero_grad() override;
  /// Current stream; capture-safe after the first step (see the class comment).
  void step() override;
  bool capturable() const override { return true; }
  std::string name() const override { return "tandem::optim::Sgd"; }
  std::vector<at::Tensor> parameters() const override { return params_; }
  /// Enqueues an update of the learning-rate tensor on the current stream (lr >= 0): eager
  /// steps and replays of a graph captured earlier that run after it on that stream use the new
  /// value. Call it outside the captured body (inside, the fill would be recorded and every
  /// replay would write the same value again).
  void set_lr(double lr) override;
  double learning_rate() const override;
  const at::Tensor& lr() const { return lr_; }  ///< 0-dim float32 on the params' device
  /// Whether the last step() ran as the fused kernel (false: op by op — mixed dtypes, a
  /// gradient laid out unlike its parameter, or `fused` off): a slow optimizer step's first
  /// suspect.
  bool fused_last_step() const { return fused_last_step_; }
  /// "lr", then "momentum_buffer.<i>" for each parameter i that has one (after its first step).
  std::vector<std::pair<std::string, at::Tensor>> state() const override;
  /// Creates the momentum buffers it names: a resumed step continues the momentum.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) override;
  /// Optimizer::skip_steps_where. A momentum buffer is then made as zeros: where a parameter's
  /// first step is skipped, its next one starts the momentum from (1 - dampening) * d instead of
  /// d — the same for the default dampening 0 (torch's GradScaler does not call a skipped step at
  /// all, so its next step is the first).
  void skip_steps_where(const at::Tensor& found_inf) override;

 private:
  std::vector<at::Tensor> params_;
  SgdOptions options_;    // options_.lr is the initial learning rate; lr_ holds the current one
  at::Tensor found_inf_;  // undefined: no step is skipped
  at::Tensor lr_;         // () float32 on the params' device
  std::vector<at::Tensor> momentum_buffers_;  // undefined until a parameter's first step
  bool fused_last_step_ = false;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  /// false: Adam (weight decay added to the gradient); true: AdamW (decoupled: p *= 1 - lr*wd).
  bool decoupled_weight_decay = false;
  /// true: LibTorch's fused multi-tensor Adam/AdamW kernel where it takes the parameters (one
  /// floating dtype, gradients and moments laid out like their parameters); false: the same
  /// update op by op (the reference the fused path is tested against).
  bool fused = true;

  /// torch.optim.AdamW's defaults (weight decay 1e-2, decoupled) with learning rate `lr`.
  static AdamOptions adamw(double lr = 1e-3, double weight_decay = 1e-2) {
    AdamOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    o.decoupled_weight_decay = true;
    return o;
  }
};

/// Adam / AdamW with all state on the parameters' device: torch.optim.Adam's update with lr and
/// the step count read from device tensors. The whole update is one call of LibTorch's fused
/// kernel (`at::_fused_adam_` / `at::_fused_adamw_`, multi-tensor) when the parameters share one
/// floating dtype and each gradient is laid out like its parameter; otherwise it runs op by op.
/// step() is capture-safe once every parameter has a gradient (the state is created at
/// construction, not at the first step).
class Adam : public Optimizer {
 public:
  Adam(std::vector<at::Tensor> params, AdamOptions options);

  void zero_grad() override;
  void step() override;
  bool capturable() const override { return true; }
  std::string name() const override {
    return options_.decoupled_weight_decay ? "tandem::optim::AdamW" : "tandem::optim::Adam";
  }
  std::vector<at::Tensor> parameters() const override { return params_; }
  /// Enqueues an update of the learning-rate tensor on the current stream (lr >= 0): replays of
  /// a graph captured earlier use the new value (a schedule that works under replay).
  void set_lr(double lr) override;
  double learning_rate() const override;
  const at::Tensor& lr() const { return lr_; }  ///< 0-dim float32 on the device
  /// "lr", "step", then "exp_avg.<i>" and "exp_avg_sq.<i>" for each parameter i.
  std::vector<std::pair<std::string, at::Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) override;
  const at::Tensor& steps() const { return step_; }  ///< 0-dim float32: steps taken
  /// Whether the last step() ran as the fused kernel (see Sgd::fused_last_step).
  bool fused_last_step() const { return fused_last_step_; }
  /// Optimizer::skip_steps_where: a skipped step does not count in steps() either.
  void skip_steps_where(const at::Tensor& found_inf) override;

 private:
  std::vector<at::Tensor> params_;
  AdamOptions options_;
  at::Tensor lr_, step_;
  at::Tensor found_inf_;  // undefined: no step is skipped
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  bool fused_last_step_ = false;
};

/// AdamW: Adam with decoupled weight decay (default 1e-2, as torch.optim.AdamW).
inline Adam make_adamw(std::vector<at::Tensor> params,
                       AdamOptions options = {1e-3, 0.9, 0.999, 1e-8, 1e-2, true}) {
  options.decoupled_weight_decay = true;
  return Adam(std::move(params), options);
}

// ---- Learning-rate schedules that work under CUDA-graph replay ----
//
// A captured step does not contain the learning rate: Sgd and Adam multiply by their lr()
// tensor, and the captured kernels read that tensor's memory at every replay. So the host
// evaluates the schedule between replays and calls set_lr, which enqueues a fill of that memory
// on the current stream:
//
//   train lane:  [set_lr(s(0))]──[replay]──[set_lr(s(1))]──[replay]──[set_lr(s(2))]── ...
//
// Stream order makes each replay see the value set just before it, with no host sync. What the
// user must do: call set_lr on the lane that replays (under its LaneGuard), before that replay
// and outside the captured body. On another stream the fill races with a replay still reading
// the lr; inside the captured body the fill would be recorded, and every replay would write the
// same value again. A graph that captures K steps applies one lr to all K of them.
//
//   const optim::LrSchedule s = optim::linear_warmup(100, optim::cosine(0.1, 10'000));
//   for (int64_t i = 0; i < steps; ++i) {
//     { LaneGuard guard(lane); opt.set_lr(s(i)); }
//     graph.replay(lane);
//   }

/// The learning rate for 0-based step `step`: any callable works; the factories below build
/// the common ones. They throw tandem::InvalidArgument for a negative step.
using LrSchedule = std::function<double(int64_t step)>;

/// lr at every step.
LrSchedule constant_lr(double lr);
/// torch.optim.lr_scheduler.StepLR: lr * gamma^floor(step / step_size).
LrSchedule step_decay(double lr, int64_t step_size, double gamma);
/// torch.optim.lr_scheduler.CosineAnnealingLR's closed form: min_lr + (lr - min_lr) *
/// (1 + cos(pi * step / total_steps)) / 2, held at min_lr after total_steps (no restart).
LrSchedule cosine(double lr, int64_t total_steps, double min_lr = 0);
/// A linear ramp into `after`: step s < warmup_steps gets after(0) * (s + 1) / (warmup_steps + 1)
/// (never 0), then step s gets after(s - warmup_steps), so `after` starts at its own step 0.
LrSchedule linear_warmup(int64_t warmup_steps, LrSchedule after);

}  // namespace tandem::optim
