// GatheredGrad: a layer whose weight gradient data parallel forms from every rank's batch
// instead of all-reducing it. For a large layer on a small batch the gradient is huge and the
// batch is not: seg's first decoder layer (ConvTranspose2d 4096 -> 2048, kernel 2, on a 1x1
// input) has a 134 MB weight gradient, but at batch 8 its input and output gradient are 8 x
// (4096 + 8192) floats. All-gathering those (0.4 MB per rank) and computing the gradient of the
// whole global batch on every rank is exact (it is the sum one process on the global batch
// computes), and it takes that layer's all-reduce off the end of backward, where nothing is
// left to hide it behind.
//
//   seq->push_back(tandem::GatheredGrad(torch::nn::ConvTranspose2d(
//       torch::nn::ConvTranspose2dOptions(4096, 2048, 2).stride(2))));
//
// One process (or no GradientSync, or no parameter requiring grad, or grad mode off): the
// wrapped layer's own forward, so the serial loop's numbers are unchanged. Under data parallel
// (the Runner's GradientSync::current() has world_size() > 1): the same forward, and a backward
// whose input gradient is the layer's own and whose weight and bias gradients are one GEMM over
// every rank's rows, divided by the world size (the mean the all-reduce would give). Every
// rank computes them from the same gathered bits with the same GEMM, so the ranks' weights stay
// bitwise equal. distributed::GradientBuckets leaves the layer's parameters out of its buckets.
//
// Worth it when batch x (input + output features) per rank is much less than the weight's
// size. Supported: Linear, and Conv2d / ConvTranspose2d whose kernel equals their stride with
// no padding, dilation or groups (their patches do not overlap, so the weight gradient is one
// GEMM) — the layers named above. Other layers: InvalidArgument at construction.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <ostream>

#include "tandem/error.h"

namespace tandem {

class GatheredGradImpl : public torch::nn::Module {
 public:
  explicit GatheredGradImpl(torch::nn::Linear layer);
  explicit GatheredGradImpl(torch::nn::Conv2d layer);
  explicit GatheredGradImpl(torch::nn::ConvTranspose2d layer);

  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  /// The wrapped layer's parameters, registered here under the same names ("weight", "bias"),
  /// so a state dict reads as the unwrapped layer's.
  at::Tensor weight, bias;

  /// Marks a parameter whose gradient its layer averages itself: a post-accumulate-grad hook
  /// that does nothing, which GradientBuckets looks for (and leaves the parameter out).
  static bool averages_its_own_gradient(const at::Tensor& parameter);
  /// Sets that mark (GradientBuckets restores it on the parameters it all-reduced instead).
  static void mark_averaged_by_its_layer(const at::Tensor& parameter);

  enum class Kind { kLinear, kConv, kConvTranspose };

 private:
  /// Registers the layer's parameters here and keeps its forward (defined, and instantiated,
  /// in gathered_grad.cpp: the three constructors).
  template <typename LayerImpl>
  void adopt(const std::shared_ptr<LayerImpl>& layer, Kind kind, int64_t kernel);
  Kind kind_ = Kind::kLinear;
  int64_t kernel_ = 1;
  std::shared_ptr<torch::nn::Module> layer_;
  std::function<at::Tensor(const at::Tensor&)> layer_forward_;
};
TORCH_MODULE(GatheredGrad);

}  // namespace tandem
