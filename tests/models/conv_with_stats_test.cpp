// conv2d_with_stats: off the fused path it is LibTorch's convolution and gives no sums; on a GPU
// in half and channels-last (cuDNN's convolution + statistics graph) the output is the
// convolution's, the sums are its output's, the same bits every run, the gradients LibTorch's
// convolution backward's; batch_norm_relu finalizes given sums as it would read them; and a
// ResNet's half training step with the statistics from the convolutions matches the one
// without.
#include "tandem/models/conv_with_stats.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "resnet_step.h"
#include "tandem/detail/autocast.h"
#include "tandem/error.h"
#include "tandem/models/batch_norm_relu.h"
#include "tandem/models/resnet.h"
#include "test_util.h"

namespace tandem::models {
namespace {

using test_steps::max_relative;

// ||a - b|| / ||b||: a whole gradient's difference, where a few of its elements meet the
// rounding of half's smallest values.
double norm_gap(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor fa = a.to(at::kDouble).cpu(), fb = b.to(at::kDouble).cpu();
  return (fa - fb).norm().item<double>() / std::max(fb.norm().item<double>(), 1e-30);
}

TEST(ConvWithStatsTest, OffTheFusedPathItIsTheConvolutionWithNoSums) {
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({2, 4, 9, 9}).requires_grad_();
  const at::Tensor w = torch::randn({6, 4, 3, 3}).requires_grad_();
  const ConvAndSums out = conv2d_with_stats(x, w, {2, 2}, {1, 1});
  EXPECT_FALSE(out.sums.defined());
  const at::Tensor xr = x.detach().clone().requires_grad_(),
                   wr = w.detach().clone().requires_grad_();
  const at::Tensor ref = at::conv2d(xr, wr, {}, {2, 2}, {1, 1});
  EXPECT_TRUE(at::equal(out.y, ref));
  const at::Tensor dy = torch::randn(ref.sizes());
  out.y.backward(dy);
  ref.backward(dy);
  EXPECT_TRUE(at::allclose(x.grad(), xr.grad()));
  EXPECT_TRUE(at::allclose(w.grad(), wr.grad()));
}

TEST(ConvWithStatsTest, BadShapesAreNamed) {
  const at::Tensor x = torch::randn({2, 4, 9, 9});
  try {
    conv2d_with_stats(x, torch::randn({6, 5, 3, 3}), {1, 1}, {1, 1});
    FAIL() << "a weight of 5 input channels for 4 was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[6, 5, 3, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conv2d_with_stats(x, torch::randn({6, 4, 3, 3}), {1}, {1, 1}), InvalidArgument);
}

TEST(ConvWithStatsTest, BatchNormReluRefusesSumsOfTheWrongShape) {
  torch::nn::BatchNorm2d bn(4);
  const at::Tensor x = torch::randn({2, 4, 3, 3});
  try {
    batch_norm_relu(x, *bn, {}, torch::zeros({2, 5}));
    FAIL() << "sums of 5 channels for 4 were taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 4) float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(batch_norm_relu(x, *bn, {}, torch::zeros({2, 4}, torch::kDouble)), InvalidArgument);
}

// The convolutions of a ResNet-50's bottlenecks, small: a reducing and an expanding 1x1, a 3x3,
// a strided 3x3 and a strided 1x1 (the downsample).
struct ConvShape {
  int64_t c, k, size, kernel, stride;
};
const ConvShape kConvShapes[] = {{64, 16, 14, 1, 1},
                                 {16, 64, 14, 1, 1},
                                 {16, 16, 14, 3, 1},
                                 {32, 32, 14, 3, 2},
                                 {64, 128, 14, 1, 2}};

TEST(ConvWithStatsGpuTest, TheOutputIsTheConvolutionsAndTheSumsAreItsOutputsEveryRun) {
  TANDEM_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(conv_with_stats_compiled()) << "this build has no cuDNN frontend";
  const c10::Device cuda(c10::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (const ConvShape& s : kConvShapes) {
    SCOPED_TRACE(std::to_string(s.c) + "->" + std::to_string(s.k) + " " + std::to_string(s.kernel) +
                 "x" + std::to_string(s.kernel) + " stride " + std::to_string(s.stride));
    torch::manual_seed(5);
    // Inputs as a ResNet's: non-negative (after a ReLU), weights of He's scale.
    const at::Tensor x = torch::rand({8, s.c, s.size, s.size}).to(cuda, at::kHalf).contiguous(cl);
    const at::Tensor w = (torch::randn({s.k, s.c, s.kernel, s.kernel}) *
                          std::sqrt(2.0 / static_cast<double>(s.c * s.kernel * s.kernel)))
                             .to(cuda, at::kHalf)
                             .contiguous(cl);
    const int64_t pad = s.kernel / 2;
    // Each call's sums land in a block the caching allocator hands on from a freed tensor of
    // NaN: sums added to what their buffer held, rather than written, would be NaN.
    auto run = [&] {
      (void)at::full({2, s.k}, std::numeric_limits<float>::quiet_NaN(),
                     x.options().dtype(at::kFloat));
      return conv2d_with_stats(x, w, {s.stride, s.stride}, {pad, pad}, true);
    };
    const ConvAndSums a = run();
    const ConvAndSums b = run();
    ASSERT_TRUE(a.sums.defined()) << "not fused: cuDNN had no graph for the shape (see stderr)";
    EXPECT_TRUE(a.y.is_contiguous(cl));
    EXPECT_EQ(a.sums.sizes(), (std::vector<int64_t>{2, s.k}));
    const at::Tensor ref = at::conv2d(x, w, {}, {s.stride, s.stride}, {pad, pad});
    EXPECT_LT(max_relative(a.y, ref), 5e-3);
    // The sums of the output as written (half) in float64; the epilogue sums values before or
    // after their rounding to half: within half's rounding, averaged over the rows.
    const at::Tensor y64 = a.y.to(at::kDouble);
    const at::Tensor sum = y64.sum({0, 2, 3}), squares = y64.square().sum({0, 2, 3});
    for (const ConvAndSums* r : {&a, &b}) {
      EXPECT_LT(max_relative(r->sums[0], sum), 1e-3);
      EXPECT_LT(max_relative(r->sums[1], squares), 1e-3);
    }
    EXPECT_TRUE(at::equal(a.y, b.y));
    // The epilogue's reduction order varies between runs on some shapes (not bit for bit): the
    // same sums within float32's rounding of them.
    EXPECT_LT(max_relative(a.sums, b.sums), 1e-5) << "the sums of two runs";
  }
}

TEST(ConvWithStatsGpuTest, TheGradientsAreLibTorchsConvolutionBackwards) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  torch::manual_seed(6);
  const at::Tensor x =
      torch::rand({8, 32, 14, 14}).to(cuda, at::kHalf).contiguous(cl).requires_grad_();
  const at::Tensor w =
      (torch::randn({32, 32, 3, 3}) * 0.08).to(cuda, at::kHalf).contiguous(cl).requires_grad_();
  const ConvAndSums out = conv2d_with_stats(x, w, {2, 2}, {1, 1}, true);
  EXPECT_TRUE(out.sums.defined());
  EXPECT_FALSE(out.sums.requires_grad());
  const at::Tensor xr = x.detach().clone().requires_grad_(),
                   wr = w.detach().clone().requires_grad_();
  const at::Tensor ref = at::conv2d(xr, wr, {}, {2, 2}, {1, 1});
  const at::Tensor dy = torch::randn(ref.sizes()).to(cuda, at::kHalf).contiguous(cl);
  out.y.backward(dy);
  ref.backward(dy);
  EXPECT_LT(max_relative(x.grad(), xr.grad()), 5e-3);
  EXPECT_LT(max_relative(w.grad(), wr.grad()), 5e-3);
}

// relu(bn(x)) from given sums against the same op reading x: the same output within half's
// rounding, the same statistics and gradients within float32's difference of the two sums.
TEST(ConvWithStatsGpuTest, BatchNormReluFromGivenSumsIsTheOneReadingItsInput) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  torch::manual_seed(7);
  const at::Tensor x0 =
      (torch::randn({8, 64, 14, 14}) * 2 + 0.5).to(cuda, at::kHalf).contiguous(cl);
  const at::Tensor x64 = x0.to(at::kDouble);
  const at::Tensor sums =
      at::stack({x64.sum({0, 2, 3}), x64.square().sum({0, 2, 3})}).to(at::kFloat).contiguous();
  torch::nn::BatchNorm2d given(64), read(64);
  given->to(cuda);
  read->to(cuda);
  const at::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
  const at::Tensor ya = batch_norm_relu(xa, *given, {}, sums), yb = batch_norm_relu(xb, *read);
  EXPECT_LT(max_relative(ya, yb), 2e-3);
  EXPECT_LT(max_relative(given->running_mean, read->running_mean), 1e-4);
  EXPECT_LT(max_relative(given->running_var, read->running_var), 1e-4);
  EXPECT_EQ(given->num_batches_tracked.item<int64_t>(), 1);
  const at::Tensor dy = torch::randn(x0.sizes()).to(cuda, at::kHalf).contiguous(cl);
  ya.backward(dy);
  yb.backward(dy);
  EXPECT_LT(max_relative(xa.grad(), xb.grad()), 1e-2);
  EXPECT_LT(max_relative(given->weight.grad(), read->weight.grad()), 1e-2);
  EXPECT_LT(max_relative(given->bias.grad(), read->bias.grad()), 1e-3);
}

// One training step of a channels-last ResNet (the net's factory) under `precision`, from the
// same weights and data, with its batch norms' sums from the convolutions or read by the batch
// norms. Its loss scaled as a half-precision run scales it, so the gradients stay clear of
// half's underflow (their comparison is of the sums, not of flushed values).
test_steps::ResNetStep resnet_step(ResNet (*make)(ResNetOptions), bool stats_in_convolutions,
                                   Precision precision = Precision::kFp16) {
  ResNetOptions options;
  options.num_classes = 10;
  options.stats_in_convolutions = stats_in_convolutions;
  return test_steps::resnet_step(make, options, precision, /*steps=*/1, /*loss_scale=*/1024);
}

// Half precision's step with the sums from the convolutions is about as near the float32 step as
// the one whose batch norms read their inputs: half's rounding, not the sums, decides the
// distance. Not within 1.5x: the fused step's convolutions are other kernels than LibTorch's
// picks, and its sums vary in their last bits between runs, so on a ResNet of 16 images of 64 px
// (64 values a channel in its last stage) the gap came out 1.65-1.86x the other's, run to run,
// and the last stage's running statistics 1.1-2.0% apart (H200). A wrong statistic moves them
// by their own size.
void expect_steps_match(ResNet (*make)(ResNetOptions), const char* name) {
  SCOPED_TRACE(name);
  at::globalContext().setAllowTF32CuDNN(false);  // the float32 reference without TF32
  const test_steps::ResNetStep exact = resnet_step(make, false, Precision::kFp32);
  at::globalContext().setAllowTF32CuDNN(true);
  const test_steps::ResNetStep fused = resnet_step(make, true), read = resnet_step(make, false);
  EXPECT_LT(max_relative(fused.loss, read.loss), 1e-2);
  ASSERT_EQ(fused.grads.size(), read.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    const double fused_gap = norm_gap(fused.grads[i].second, exact.grads[i].second);
    const double read_gap = norm_gap(read.grads[i].second, exact.grads[i].second);
    EXPECT_LT(fused_gap, 3 * read_gap + 1e-3)
        << "gradient of " << fused.grads[i].first << ": " << fused_gap << " from float32's, "
        << read_gap << " reading the inputs";
  }
  for (size_t i = 0; i < fused.buffers.size(); ++i)
    EXPECT_LT(max_relative(fused.buffers[i].second, read.buffers[i].second), 5e-2)
        << fused.buffers[i].first;
}

TEST(ConvWithStatsGpuTest, AResNetsHalfStepWithTheSumsFromTheConvolutionsMatchesTheOneWithout) {
  TANDEM_SKIP_WITHOUT_CUDA();
  expect_steps_match(resnet18, "resnet18");
  expect_steps_match(resnet50, "resnet50");
}

}  // namespace
}  // namespace tandem::models
