// FcnResNet: a ResNet's layer4 map, torchvision's FCNHead, bilinear upsampling (see fcn.h).
#include "tandem/models/fcn.h"

#include <torch/nn/functional/upsampling.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>

#include "tandem/error.h"

namespace tandem::models {

namespace F = torch::nn::functional;

FcnResNetImpl::FcnResNetImpl(FcnOptions options) : options_(std::move(options)) {
  TANDEM_CHECK_ARG(options_.num_classes >= 1, "FCN: num_classes ", options_.num_classes,
                   " is not valid: expected >= 1");
  backbone = register_module("backbone", resnet(options_.backbone));
  const int64_t in = backbone->feature_dim(), mid = in / 4;
  classifier = register_module(
      "classifier",
      torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, mid, 3).padding(1).bias(false)),
          torch::nn::BatchNorm2d(mid), torch::nn::ReLU(torch::nn::ReLUOptions(true)),
          torch::nn::Dropout(options_.dropout),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(mid, options_.num_classes, 1))));
}

torch::Tensor FcnResNetImpl::forward(const torch::Tensor& x) {
  const torch::Tensor logits = classifier->forward(backbone->feature_map(x));
  return F::interpolate(logits, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{x.size(2), x.size(3)})
                                    .mode(torch::kBilinear)
                                    .align_corners(false));
}

}  // namespace tandem::models
