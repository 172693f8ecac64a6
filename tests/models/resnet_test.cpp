// ResNet-18/34/50: torchvision's parameter counts, state_dict keys (names, order, shapes),
// initialization, output shapes, and the errors for a bad name, class count or input. CPU only.
#include "tandem/models/resnet.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tandem/error.h"

namespace tandem::models {
namespace {

int64_t parameter_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

// Every parameter and buffer by its full name, as a state_dict holds them.
std::map<std::string, torch::Tensor> state_tensors(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : module.named_parameters()) out[p.key()] = p.value();
  for (const auto& b : module.named_buffers()) out[b.key()] = b.value();
  return out;
}

std::vector<int64_t> shape_of(torch::nn::Module& module, const std::string& key) {
  auto tensors = state_tensors(module);
  auto it = tensors.find(key);
  if (it == tensors.end()) {
    ADD_FAILURE() << "no state_dict key " << key;
    return {};
  }
  return it->second.sizes().vec();
}

ptrdiff_t index_of(const std::vector<std::string>& keys, const std::string& key) {
  auto it = std::find(keys.begin(), keys.end(), key);
  return it == keys.end() ? -1 : it - keys.begin();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

using Shape = std::vector<int64_t>;

TEST(ResNetTest, ParameterCountsAreTorchvisions) {
  torch::manual_seed(0);
  auto r18 = resnet18(), r34 = resnet34(), r50 = resnet50();
  EXPECT_EQ(parameter_count(*r18), 11689512);
  EXPECT_EQ(parameter_count(*r34), 21797672);
  EXPECT_EQ(parameter_count(*r50), 25557032);
  EXPECT_EQ(r18->feature_dim(), 512);
  EXPECT_EQ(r34->feature_dim(), 512);
  EXPECT_EQ(r50->feature_dim(), 2048);
}

TEST(ResNetTest, StateDictKeyCountsAreTorchvisions) {
  // resnet18: stem 6 (conv1 + bn1's 5) + 8 blocks x 12 + 3 downsamples x 6 + fc 2 = 122.
  // resnet34: 6 + 16 x 12 + 3 x 6 + 2 = 218. resnet50: 6 + 16 x 18 + 4 x 6 + 2 = 320.
  EXPECT_EQ(state_dict_keys(*resnet18()).size(), 122u);
  EXPECT_EQ(state_dict_keys(*resnet34()).size(), 218u);
  EXPECT_EQ(state_dict_keys(*resnet50()).size(), 320u);
}

TEST(ResNetTest, StateDictKeysAreExactlyTheParametersAndBuffers) {
  for (const auto& name : resnet_names()) {
    auto net = resnet(name);
    const auto keys = state_dict_keys(*net);
    const std::set<std::string> key_set(keys.begin(), keys.end());
    EXPECT_EQ(key_set.size(), keys.size()) << name << ": a key appears twice";
    std::set<std::string> expected;
    for (const auto& [key, tensor] : state_tensors(*net)) expected.insert(key);
    EXPECT_EQ(key_set, expected) << name;
  }
}

TEST(ResNetTest, KeyOrderIsTorchvisionsStateDictOrder) {
  const auto keys = state_dict_keys(*resnet18());
  const std::vector<std::string> head = {
      "conv1.weight",
      "bn1.weight",
      "bn1.bias",
      "bn1.running_mean",
      "bn1.running_var",
      "bn1.num_batches_tracked",
      "layer1.0.conv1.weight",
      "layer1.0.bn1.weight",
      "layer1.0.bn1.bias",
      "layer1.0.bn1.running_mean",
      "layer1.0.bn1.running_var",
      "layer1.0.bn1.num_batches_tracked",
      "layer1.0.conv2.weight",
      "layer1.0.bn2.weight",
  };
  ASSERT_GE(keys.size(), head.size());
  for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(keys[i], head[i]) << "at index " << i;
  // A block's downsample comes after its own convs and BNs; fc closes the list.
  const auto layer2_bn2 = index_of(keys, "layer2.0.bn2.num_batches_tracked");
  ASSERT_GE(layer2_bn2, 0);
  EXPECT_EQ(keys[layer2_bn2 + 1], "layer2.0.downsample.0.weight");
  EXPECT_EQ(keys[layer2_bn2 + 2], "layer2.0.downsample.1.weight");
  EXPECT_EQ(keys[layer2_bn2 + 6], "layer2.0.downsample.1.num_batches_tracked");
  EXPECT_EQ(keys[layer2_bn2 + 7], "layer2.1.conv1.weight");
  EXPECT_EQ(keys[keys.size() - 2], "fc.weight");
  EXPECT_EQ(keys.back(), "fc.bias");
  EXPECT_EQ(index_of(keys, "layer4.1.bn2.num_batches_tracked"),
            static_cast<ptrdiff_t>(keys.size()) - 3);
}

TEST(ResNetTest, ResNet50IsBottleneckV15WithTorchvisionsShapes) {
  auto net = resnet50();
  EXPECT_EQ(shape_of(*net, "conv1.weight"), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(shape_of(*net, "layer1.0.conv1.weight"), (Shape{64, 64, 1, 1}));
  EXPECT_EQ(shape_of(*net, "layer1.0.downsample.0.weight"), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(shape_of(*net, "layer1.0.downsample.1.running_var"), (Shape{256}));
  EXPECT_EQ(shape_of(*net, "layer2.0.conv2.weight"), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(shape_of(*net, "layer3.5.conv3.weight"), (Shape{1024, 256, 1, 1}));
  EXPECT_EQ(shape_of(*net, "layer4.2.conv3.weight"), (Shape{2048, 512, 1, 1}));
  EXPECT_EQ(shape_of(*net, "layer4.0.downsample.0.weight"), (Shape{2048, 1024, 1, 1}));
  EXPECT_EQ(shape_of(*net, "fc.weight"), (Shape{1000, 2048}));
  EXPECT_EQ(shape_of(*net, "fc.bias"), (Shape{1000}));
  const auto keys = state_dict_keys(*net);
  EXPECT_EQ(index_of(keys, "layer1.1.downsample.0.weight"), -1);  // only a layer's first block
  EXPECT_EQ(index_of(keys, "layer4.3.conv1.weight"), -1);         // {3, 4, 6, 3} blocks
  EXPECT_GE(index_of(keys, "layer3.5.bn3.running_mean"), 0);

  // v1.5: the stride sits on the 3x3 conv2, not on the first 1x1 (the paper's v1).
  auto first = net->layer2[0]->as<Bottleneck>();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ((*first->conv1->options.stride())[0], 1);
  EXPECT_EQ((*first->conv2->options.stride())[0], 2);
  EXPECT_EQ((*first->downsample[0]->as<torch::nn::Conv2d>()->options.stride())[0], 2);
}

TEST(ResNetTest, ResNet18HasDownsampleOnlyWhereTheShapeChanges) {
  auto net = resnet18();
  const auto keys = state_dict_keys(*net);
  for (const auto& key : keys)
    EXPECT_FALSE(starts_with(key, "layer1.") && contains(key, ".downsample.")) << key;
  EXPECT_FALSE(net->layer1[0]->as<BasicBlock>()->downsample);
  EXPECT_EQ(shape_of(*net, "layer2.0.downsample.0.weight"), (Shape{128, 64, 1, 1}));
  EXPECT_EQ(shape_of(*net, "layer4.1.conv2.weight"), (Shape{512, 512, 3, 3}));
  EXPECT_EQ(shape_of(*net, "fc.weight"), (Shape{1000, 512}));
  for (const auto& key : keys)
    EXPECT_FALSE(contains(key, "conv") && ends_with(key, ".bias"))
        << "convs carry no bias: " << key;
}

TEST(ResNetTest, NumClassesSizesOnlyTheClassifier) {
  auto net = resnet34({/*num_classes=*/10});
  EXPECT_EQ(shape_of(*net, "fc.weight"), (Shape{10, 512}));
  EXPECT_EQ(parameter_count(*net), 21797672 - 1000 * 513 + 10 * 513);
  EXPECT_EQ(net->fc->options.out_features(), 10);
}

TEST(ResNetTest, InitializationIsTorchvisions) {
  torch::manual_seed(0);
  auto net = resnet18();
  for (const auto& [key, tensor] : state_tensors(*net)) {
    const bool bn = contains(key, "bn") || contains(key, "downsample.1.");
    if (bn && ends_with(key, ".weight")) {
      EXPECT_TRUE(torch::equal(tensor, torch::ones_like(tensor))) << key;
    }
    if (bn && ends_with(key, ".bias")) {
      EXPECT_TRUE(torch::equal(tensor, torch::zeros_like(tensor))) << key;
    }
  }
  const auto tracked = state_tensors(*net).at("bn1.num_batches_tracked");
  EXPECT_EQ(tracked.scalar_type(), torch::kLong);
  EXPECT_EQ(tracked.dim(), 0);
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * kh * kw)). 2.4M draws put
  // the sample std within well under 1% of it; LibTorch's default conv init (uniform, fan_in,
  // a = sqrt(5)) would give sqrt(1 / (3 * fan_in)) = 0.0120 here instead of 0.0208.
  const auto w = state_tensors(*net).at("layer4.0.conv2.weight");  // (512, 512, 3, 3)
  const double expected_std = std::sqrt(2.0 / (512 * 3 * 3));
  EXPECT_NEAR(w.std().item<double>(), expected_std, 0.01 * expected_std);
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.01 * expected_std);
}

TEST(ResNetTest, ForwardAndFeaturesShapes) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 3, 64, 64});
  for (const auto& name : resnet_names()) {
    auto net = resnet(name, {/*num_classes=*/7});
    net->eval();
    torch::NoGradGuard no_grad;
    const auto features = net->features(x);
    const auto logits = net->forward(x);
    EXPECT_EQ(features.sizes().vec(), (Shape{2, net->feature_dim()})) << name;
    EXPECT_EQ(logits.sizes().vec(), (Shape{2, 7})) << name;
    EXPECT_TRUE(torch::allclose(logits, net->fc(features))) << name;
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>()) << name;
    EXPECT_GT(features.abs().sum().item<double>(), 0.0) << name;
  }
}

TEST(ResNetTest, TrainingStepReachesEveryParameter) {
  torch::manual_seed(0);
  auto net = resnet18({/*num_classes=*/5});
  net->train();
  const auto loss = net->forward(torch::randn({2, 3, 32, 32})).square().mean();
  loss.backward();
  for (const auto& p : net->named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
  EXPECT_EQ(state_tensors(*net).at("layer3.0.downsample.1.num_batches_tracked").item<int64_t>(), 1);
}

TEST(ResNetTest, UnknownNameListsTheValidOnes) {
  try {
    resnet("resnet101");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'resnet101'"), std::string::npos) << what;
    EXPECT_NE(what.find("resnet18, resnet34, resnet50"), std::string::npos) << what;
  }
  EXPECT_EQ(resnet_names(), (std::vector<std::string>{"resnet18", "resnet34", "resnet50"}));
}

TEST(ResNetTest, BadOptionsAndInputsAreInvalidArguments) {
  EXPECT_THROW(resnet18({/*num_classes=*/0}), InvalidArgument);
  EXPECT_THROW(ResNet(ResNetBlock::kBasic, std::array<int64_t, 4>{2, 0, 2, 2}), InvalidArgument);
  auto net = resnet18();
  try {
    net->forward(torch::randn({2, 1, 32, 32}));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 1, 32, 32]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(net->features(torch::randn({3, 32, 32})), InvalidArgument);
}

}  // namespace
}  // namespace tandem::models
