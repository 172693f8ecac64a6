// tandem::optim::Sgd applies exactly LibTorch's SGD update (no momentum), with fewer launches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "tandem/error.h"
#include "tandem/optim.h"

namespace tandem {
namespace {

TEST(SgdTest, MatchesTorchSgdOverManySteps) {
  at::manual_seed(5);
  std::vector<at::Tensor> ours, theirs;
  for (auto shape : {std::vector<int64_t>{7, 3}, {129}, {2, 2, 5}}) {
    at::Tensor p = at::randn(shape);
    ours.push_back(p.clone().set_requires_grad(true));
    theirs.push_back(p.clone().set_requires_grad(true));
  }
  optim::Sgd sgd(ours, 0.05);
  torch::optim::SGD reference(theirs, torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 10; ++step) {
    sgd.zero_grad();
    reference.zero_grad();
    const double phase = step * 0.3;  // the gradient changes from step to step
    auto loss = [&](const std::vector<at::Tensor>& ps) {
      at::Tensor sum = at::zeros({1});
      for (const auto& p : ps) sum = sum + (p * p).sum() * 0.5 + (p + phase).sin().sum();
      return sum.sum();
    };
    loss(ours).backward();
    loss(theirs).backward();
    sgd.step();
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i)
      ASSERT_TRUE(at::allclose(ours[i], theirs[i], 1e-6, 1e-6))
          << "parameter " << i << " differs after step " << step << " by "
          << (ours[i] - theirs[i]).abs().max().item<float>();
  }
}

TEST(SgdTest, ZeroGradClearsAndStepSkipsParametersWithoutGrad) {
  at::Tensor a = at::ones({3}).set_requires_grad(true);
  at::Tensor b = at::ones({3}).set_requires_grad(true);
  optim::Sgd sgd({a, b}, 0.5);
  (a * 2).sum().backward();
  sgd.step();
  EXPECT_TRUE(a.detach().equal(at::zeros({3})));  // 1 - 0.5 * 2
  EXPECT_TRUE(b.detach().equal(at::ones({3})));   // no grad: untouched
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(SgdTest, RejectsBadLearningRate) {
  EXPECT_THROW(optim::Sgd({at::ones({1}).set_requires_grad(true)}, 0.0), InvalidArgument);
}

}  // namespace
}  // namespace tandem
