// The small CNN: its size, its shapes, its errors, and that it learns a toy task on the CPU.
#include "tandem/models/small_cnn.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <string>

#include "tandem/error.h"
#include "tandem/models/resnet.h"

namespace tandem::models {
namespace {

TEST(SmallCnnTest, HasItsParameterCountAndShapes) {
  SmallCnn net;
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  EXPECT_EQ(n, 468010);
  EXPECT_EQ(net->forward(at::randn({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
  SmallCnn rgb(SmallCnnOptions{3, 4, 32});
  EXPECT_EQ(rgb->forward(at::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(state_dict_keys(*net).front(), "conv1.weight");
}

TEST(SmallCnnTest, BadOptionsAndInputsAreNamed) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] {
              SmallCnn(SmallCnnOptions{1, 10, 30});
            }).find("image size 30"),
            std::string::npos);
  EXPECT_NE(message([] {
              SmallCnn(SmallCnnOptions{1, 0});
            }).find("num_classes 0"),
            std::string::npos);
  SmallCnn net;
  EXPECT_NE(message([&] {
              net->forward(at::randn({2, 3, 28, 28}));
            }).find("expected (B, 1, 28, 28)"),
            std::string::npos);
}

// Four classes: which quadrant holds a bright square, on noise. Far above chance (0.25) quickly.
TEST(SmallCnnTest, LearnsWhereTheBrightSquareIs) {
  torch::manual_seed(0);
  at::manual_seed(0);
  SmallCnn net(SmallCnnOptions{1, 4, 16});
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(2e-3));
  auto batch = [](int64_t n) {
    at::Tensor x = at::rand({n, 1, 16, 16}) * 0.3;
    at::Tensor y = at::randint(0, 4, {n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t q = y[i].item<int64_t>();
      x[i][0].narrow(0, (q / 2) * 8 + 2, 4).narrow(1, (q % 2) * 8 + 2, 4).add_(1.0);
    }
    return std::make_pair(x, y);
  };
  for (int step = 0; step < 40; ++step) {
    auto [x, y] = batch(32);
    opt.zero_grad();
    at::cross_entropy_loss(net->forward(x), y).backward();
    opt.step();
  }
  net->eval();
  auto [x, y] = batch(200);
  const double accuracy = net->forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>();
  EXPECT_GE(accuracy, 0.9) << "chance is 0.25";
}

}  // namespace
}  // namespace tandem::models
