// FoldedResNet: batch norm folded into the convolutions gives the module's eval-mode features
// (ResNet-18's basic blocks and ResNet-50's bottlenecks, downsampling included), folds at its
// first call from the weights then, and on a GPU runs cuDNN's fused conv + bias (+ add) + ReLU
// calls within bf16 tolerance of the unfused ops.
#include "tandem/models/folded_resnet.h"

#include <gtest/gtest.h>

#include "tandem/detail/autocast.h"
#include "tandem/error.h"
#include "test_util.h"

namespace tandem::models {
namespace {

// Running statistics and affine maps far from the identity, so a wrong fold shows.
void randomize_batch_norms(ResNetImpl& net) {
  torch::NoGradGuard no_grad;
  for (const auto& m : net.modules(/*include_self=*/false))
    if (auto* bn = m->as<torch::nn::BatchNorm2dImpl>()) {
      bn->running_mean.normal_(0, 0.5);
      bn->running_var.uniform_(0.5, 2.0);
      bn->weight.uniform_(0.5, 1.5);
      bn->bias.normal_(0, 0.2);
    }
}

// max |a - b| / max |b|
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor fa = a.to(at::kDouble).cpu(), fb = b.to(at::kDouble).cpu();
  return (fa - fb).abs().max().item<double>() / fb.abs().max().item<double>();
}

TEST(FoldedResNetTest, MatchesTheModulesEvalFeaturesForBasicAndBottleneckBlocks) {
  for (const char* name : {"resnet18", "resnet50"}) {
    torch::manual_seed(3);
    ResNet net = resnet(name, ResNetOptions{10});
    randomize_batch_norms(*net);
    net->eval();
    const at::Tensor x = torch::randn({2, 3, 40, 40});
    at::Tensor expected;
    {
      torch::NoGradGuard no_grad;
      expected = net->features(x);
    }
    FoldedResNet folded(net);
    const at::Tensor got = folded.features(x);
    EXPECT_EQ(got.sizes(), expected.sizes()) << name;
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_LT(relative_difference(got, expected), 1e-4) << name;
    EXPECT_EQ(folded.fused_convolutions(), 0) << "nothing is fused on the CPU";
    EXPECT_EQ(folded.convolutions(), std::string(name) == "resnet18" ? 20 : 53) << name;
    EXPECT_EQ(folded.feature_dim(), net->feature_dim());
  }
}

TEST(FoldedResNetTest, FoldsTheWeightsOfItsFirstCallAndKeepsThem) {
  torch::manual_seed(4);
  ResNet net = resnet18(ResNetOptions{10});
  net->eval();
  FoldedResNet folded(net);
  randomize_batch_norms(*net);  // after construction, before the first call: these count
  const at::Tensor x = torch::randn({1, 3, 32, 32});
  torch::NoGradGuard no_grad;
  const at::Tensor first = folded.features(x);
  EXPECT_LT(relative_difference(first, net->features(x)), 1e-4);
  randomize_batch_norms(*net);  // a frozen module must not change: the fold is not redone
  EXPECT_TRUE(folded.features(x).equal(first));
}

TEST(FoldedResNetTest, RejectsABadInputAndDtype) {
  ResNet net = resnet18();
  FoldedResNet folded(net);
  EXPECT_THROW(folded.features(torch::randn({1, 1, 32, 32})), InvalidArgument);
  EXPECT_THROW(FoldedResNet(net, FoldedResNetOptions{at::kDouble}), InvalidArgument);
  EXPECT_THROW(FoldedResNet(nullptr), InvalidArgument);
}

// On the GPU in bf16 channels-last, as a frozen backbone runs: cuDNN's fused calls against the
// same folded arithmetic as separate ops, and both against the module under bf16 autocast.
TEST(FoldedResNetGpuTest, FusedCudnnCallsMatchTheUnfusedOpsInBf16) {
  TANDEM_SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  ResNet net = resnet50(ResNetOptions{10});
  randomize_batch_norms(*net);
  net->to(torch::kCUDA);
  to_channels_last(*net);
  net->eval();
  const at::Tensor x =
      torch::randn({8, 3, 224, 224}).to(torch::kCUDA).contiguous(at::MemoryFormat::ChannelsLast);
  FoldedResNet fused(net, {at::kBFloat16, true}), unfused(net, {at::kBFloat16, false});
  const at::Tensor a = fused.features(x), b = unfused.features(x);
  EXPECT_EQ(a.scalar_type(), at::kBFloat16);
  EXPECT_GT(fused.fused_convolutions(), fused.convolutions() / 2)
      << "cuDNN refused most fused calls";
  EXPECT_EQ(unfused.fused_convolutions(), 0);
  EXPECT_LT(relative_difference(a, b), 2e-2);
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    AutocastScope autocast(x.device(), Precision::kBf16);
    expected = net->features(x);
  }
  EXPECT_LT(relative_difference(a, expected), 5e-2);
}

}  // namespace
}  // namespace tandem::models
