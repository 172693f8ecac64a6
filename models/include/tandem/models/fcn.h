// A segmentation net over a ResNet backbone, FCN-style: torchvision's FCNHead (3x3 conv to a
// quarter of the channels, batch norm, ReLU, dropout 0.1, 1x1 conv to the classes) on layer4's
// map, upsampled bilinearly to the input size. The backbone is undilated (output stride 32,
// torchvision's fcn_resnet50 dilates to 8), so masks are coarse; the state_dict keys are
// torchvision's: backbone.conv1.weight ... classifier.4.bias (the backbone's fc stays, unused,
// so a classification checkpoint of the same ResNet loads into `backbone` by name).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "tandem/models/resnet.h"

namespace tandem::models {

struct FcnOptions {
  std::string backbone = "resnet18";  ///< resnet18, resnet34 or resnet50
  int64_t num_classes = 21;           ///< >= 1
  double dropout = 0.1;               ///< in the head, training mode only
};

class FcnResNetImpl : public torch::nn::Module {
 public:
  /// Throws InvalidArgument for an unknown backbone or num_classes < 1.
  explicit FcnResNetImpl(FcnOptions options = {});
  /// (B, 3, H, W) float -> (B, num_classes, H, W) logits.
  torch::Tensor forward(const torch::Tensor& x);

  ResNet backbone{nullptr};
  torch::nn::Sequential classifier{nullptr};

 private:
  FcnOptions options_;
};
TORCH_MODULE(FcnResNet);

}  // namespace tandem::models
