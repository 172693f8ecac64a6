// cast_together: each tensor its cast with its own layout, the gradients back in each tensor's
// dtype and layout (a size-1 dimension's stride aside), none for a tensor that wants none; and a
// ResNet's bf16 training step with the convolution weights cast together is, bit for bit, the
// step with autocast's own casts.
#include "tandem/models/cast_together.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "resnet_step.h"
#include "tandem/detail/autocast.h"
#include "tandem/models/resnet.h"
#include "test_util.h"

namespace tandem::models {
namespace {

// Weights as a ResNet holds them on `device`: a channels-last 3x3 and 1x1 convolution weight,
// a bias, a transposed matrix (dense, not contiguous).
std::vector<at::Tensor> weights(c10::Device device) {
  torch::manual_seed(3);
  const auto cl = at::MemoryFormat::ChannelsLast;
  return {torch::randn({8, 4, 3, 3}).to(device).contiguous(cl).requires_grad_(),
          torch::randn({16, 8, 1, 1}).to(device).contiguous(cl).requires_grad_(),
          torch::randn({10}).to(device).requires_grad_(),
          torch::randn({6, 5}).to(device).t().requires_grad_()};
}

void expect_casts_and_gradients(c10::Device device) {
  const std::vector<at::Tensor> w = weights(device);
  const std::vector<at::Tensor> cast = cast_together(w, at::kBFloat16);
  ASSERT_EQ(cast.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(cast[i].scalar_type(), at::kBFloat16) << i;
    EXPECT_EQ(cast[i].strides(), w[i].strides()) << i;
    EXPECT_TRUE(at::equal(cast[i], w[i].to(at::kBFloat16))) << i;  // the same rounding
  }
  // Gradients in bf16, the 1x1 weight's contiguous as cuDNN gives it (other strides on its
  // size-1 dimensions than the channels-last weight's); the bias's cast gets none.
  std::vector<at::Tensor> grads;
  for (const at::Tensor& t : w) grads.push_back(torch::randn(t.sizes()).to(device, at::kBFloat16));
  grads[3] = grads[3].t().contiguous().t();  // the transposed matrix's gradient laid out as it
  torch::autograd::backward({cast[0], cast[1], cast[3]}, {grads[0], grads[1], grads[3]});
  for (size_t i : {0, 1, 3}) {
    ASSERT_TRUE(w[i].grad().defined()) << i;
    EXPECT_EQ(w[i].grad().scalar_type(), at::kFloat) << i;
    EXPECT_TRUE(at::equal(w[i].grad(), grads[i].to(at::kFloat))) << i;  // bf16 to float: exact
    for (int64_t d = 0; d < w[i].dim(); ++d)
      if (w[i].size(d) != 1) {
        EXPECT_EQ(w[i].grad().stride(d), w[i].stride(d)) << i << " dim " << d;
      }
  }
  EXPECT_FALSE(w[2].grad().defined());
}

TEST(CastTogetherTest, EachTensorIsItsCastAndItsGradientComesBackInItsDtypeAndLayout) {
  expect_casts_and_gradients(c10::Device(c10::kCPU));
}

TEST(CastTogetherTest, ATensorWithoutGradientGetsNoneAndAnEmptyGroupIsNothing) {
  const at::Tensor frozen = torch::randn({4, 4});
  const at::Tensor trained = torch::randn({4}).requires_grad_();
  const std::vector<at::Tensor> cast = cast_together({frozen, trained}, at::kBFloat16);
  EXPECT_FALSE(cast[0].requires_grad());
  (cast[0].to(at::kFloat).sum() + cast[1].to(at::kFloat).sum()).backward();
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_TRUE(at::equal(trained.grad(), torch::ones({4})));
  EXPECT_TRUE(cast_together({}, at::kBFloat16).empty());
}

TEST(CastTogetherGpuTest, EachTensorIsItsCastAndItsGradientComesBackInItsDtypeAndLayout) {
  TANDEM_SKIP_WITHOUT_CUDA();
  expect_casts_and_gradients(c10::Device(c10::kCUDA, 0));
}

// Two bf16 training steps of a channels-last ResNet-18 (the second reads weights the first's
// update wrote), from the same weights and data.
test_steps::ResNetStep resnet_steps(bool cast_weights_together) {
  ResNetOptions options;
  options.num_classes = 10;
  options.cast_weights_together = cast_weights_together;
  return test_steps::resnet_step(resnet18, options, Precision::kBf16, /*steps=*/2);
}

TEST(CastTogetherGpuTest, AResNetStepIsAutocastsOwnBitForBit) {
  TANDEM_SKIP_WITHOUT_CUDA();
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  const test_steps::ResNetStep together = resnet_steps(true), autocast = resnet_steps(false);
  at::globalContext().setDeterministicCuDNN(false);
  EXPECT_TRUE(at::equal(together.loss, autocast.loss))
      << together.loss.item<float>() << " against " << autocast.loss.item<float>();
  ASSERT_EQ(together.grads.size(), autocast.grads.size());
  for (size_t i = 0; i < together.grads.size(); ++i)
    EXPECT_TRUE(at::equal(together.grads[i].second, autocast.grads[i].second))
        << "gradient of " << together.grads[i].first;
  for (size_t i = 0; i < together.buffers.size(); ++i)
    EXPECT_TRUE(at::equal(together.buffers[i].second, autocast.buffers[i].second))
        << together.buffers[i].first;
}

}  // namespace
}  // namespace tandem::models
