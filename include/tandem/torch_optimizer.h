// LibTorchOptimizer: any torch::optim optimizer as a train stage's optimizer, for the eager modes.
// LibTorch's optimizers keep host-side state that a CUDA graph would freeze (SGD's lr, Adam's step
// count and bias corrections), so they say they are not capturable and the graphed modes refuse
// them with a message naming tandem's own.
#pragma once

#include <torch/optim/optimizer.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "tandem/optim.h"

namespace tandem::optim {

class LibTorchOptimizer : public Optimizer {
 public:
  /// `name` is for messages, e.g. "torch::optim::Adam".
  LibTorchOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::string name)
      : optimizer_(std::move(optimizer)), name_(std::move(name)) {}
  void zero_grad() override { optimizer_->zero_grad(/*set_to_none=*/true); }
  void step() override { optimizer_->step(); }
  bool capturable() const override { return false; }
  std::string name() const override { return name_; }
  std::vector<at::Tensor> parameters() const override {
    std::vector<at::Tensor> out;
    for (const auto& group : optimizer_->param_groups())
      out.insert(out.end(), group.params().begin(), group.params().end());
    return out;
  }
  /// The first param group's lr, as LibTorch's optimizers that have one keep it (SGD, Adam,
  /// AdamW, RMSprop, Adagrad: OptimizerOptions::get_lr); NaN for one that keeps none.
  double learning_rate() const override {
    const auto& groups = optimizer_->param_groups();
    if (groups.empty()) return std::nan("");
    try {
      return groups.front().options().get_lr();
    } catch (const std::exception&) {  // OptimizerOptions' default: "not implemented"
      return std::nan("");
    }
  }
  torch::optim::Optimizer& get() { return *optimizer_; }

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::string name_;
};

}  // namespace tandem::optim
