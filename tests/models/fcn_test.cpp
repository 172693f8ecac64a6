// FcnResNet: output shape, torchvision's key names, and that a ResNet checkpoint loads into its
// backbone by name.
#include "tandem/models/fcn.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/error.h"
#include "tandem/models/safetensors.h"

namespace tandem::models {
namespace {

TEST(FcnTest, LogitsHaveTheInputsSizeAndTorchvisionsNames) {
  torch::manual_seed(0);
  FcnResNet net(FcnOptions{"resnet18", 5});
  net->eval();
  const torch::Tensor x = torch::rand({2, 3, 70, 96});
  const torch::Tensor y = net->forward(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 70, 96}));
  EXPECT_TRUE(y.isfinite().all().item<bool>());
  std::vector<std::string> keys;
  for (const auto& [name, t] : state_dict(*net)) keys.push_back(name);
  for (const char* k : {"backbone.conv1.weight", "backbone.layer4.1.bn2.running_var",
                        "classifier.0.weight", "classifier.1.weight", "classifier.1.running_mean",
                        "classifier.4.weight", "classifier.4.bias"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  for (const auto& [name, t] : state_dict(*net))
    if (name == "classifier.0.weight") {
      EXPECT_EQ(t.sizes(), (std::vector<int64_t>{128, 512, 3, 3}));
    }
}

TEST(FcnTest, ABackboneCheckpointLoadsByName) {
  torch::manual_seed(1);
  ResNet source = resnet18();
  FcnResNet net(FcnOptions{"resnet18", 3});
  load_state_dict(*net->backbone, state_dict(*source));
  EXPECT_TRUE(torch::equal(net->backbone->conv1->weight, source->conv1->weight));
}

TEST(FcnTest, BadOptionsAreNamed) {
  EXPECT_THROW(FcnResNet(FcnOptions{"resnet18", 0}), InvalidArgument);
  EXPECT_THROW(FcnResNet(FcnOptions{"vgg16", 3}), InvalidArgument);
}

}  // namespace
}  // namespace tandem::models
