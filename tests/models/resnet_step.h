// The ResNet training step the models' GPU tests compare variants by (fused against unfused
// batch norms, weight casts, batch-norm sums): the same weights and data every call, so two
// calls differ only in what their options and precision change.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tandem/detail/autocast.h"
#include "tandem/models/resnet.h"

namespace tandem::models::test_steps {

/// The largest difference, over the largest magnitude of `b`.
inline double max_relative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor fa = a.to(at::kDouble).cpu(), fb = b.to(at::kDouble).cpu();
  return (fa - fb).abs().max().item<double>() / std::max(fb.abs().max().item<double>(), 1e-12);
}

struct ResNetStep {
  at::Tensor loss;  ///< the last step's
  std::vector<std::pair<std::string, at::Tensor>> grads, buffers;
};

/// `steps` training steps of a channels-last ResNet (`make` with `options`) on CUDA under
/// `precision`'s autocast, from seed 12's weights and 16 images of 64 x 64: SGD (lr 0.1,
/// momentum 0.9) steps between them, so a later step reads weights the earlier ones wrote. The
/// last step's loss, gradients (of its loss times `loss_scale`) and buffers.
inline ResNetStep resnet_step(ResNet (*make)(ResNetOptions), ResNetOptions options,
                              Precision precision, int steps = 1, double loss_scale = 1) {
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(12);
  ResNet net = make(options);
  const at::Tensor x =
      torch::randn({16, 3, 64, 64}).to(cuda).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor labels = torch::randint(0, options.num_classes, {16}, torch::kLong).to(cuda);
  net->to(cuda);
  to_channels_last(*net);
  net->train();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ResNetStep r;
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    {
      AutocastScope autocast(cuda, precision);
      r.loss = at::cross_entropy_loss(net->forward(x).to(at::kFloat), labels);
    }
    (loss_scale == 1 ? r.loss : r.loss * loss_scale).backward();
    if (step + 1 < steps) sgd.step();
  }
  for (const auto& p : net->named_parameters()) r.grads.emplace_back(p.key(), p.value().grad());
  for (const auto& b : net->named_buffers()) r.buffers.emplace_back(b.key(), b.value());
  return r;
}

}  // namespace tandem::models::test_steps
