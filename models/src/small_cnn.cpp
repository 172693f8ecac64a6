// The small CNN: see small_cnn.h.
#include "tandem/models/small_cnn.h"

#include <torch/nn/functional/pooling.h>

#include "tandem/error.h"

namespace tandem::models {

namespace {
torch::nn::Conv2d conv3x3(int64_t in, int64_t out) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false));
}
}  // namespace

SmallCnnImpl::SmallCnnImpl(SmallCnnOptions options) : options_(options) {
  TANDEM_CHECK_ARG(options.in_channels >= 1, "SmallCnn: in_channels ", options.in_channels,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(options.num_classes >= 1, "SmallCnn: num_classes ", options.num_classes,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(options.image_size >= 4 && options.image_size % 4 == 0, "SmallCnn: image size ",
                   options.image_size, " is not valid: expected a positive multiple of 4");
  TANDEM_CHECK_ARG(options.dropout >= 0 && options.dropout < 1, "SmallCnn: dropout ",
                   options.dropout, " is not valid: expected 0 <= p < 1");
  conv1 = register_module("conv1", conv3x3(options.in_channels, 32));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(32));
  conv2 = register_module("conv2", conv3x3(32, 32));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(32));
  conv3 = register_module("conv3", conv3x3(32, 64));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(64));
  conv4 = register_module("conv4", conv3x3(64, 64));
  bn4 = register_module("bn4", torch::nn::BatchNorm2d(64));
  const int64_t side = options.image_size / 4;
  fc1 = register_module("fc1", torch::nn::Linear(64 * side * side, 128));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout));
  fc2 = register_module("fc2", torch::nn::Linear(128, options.num_classes));
}

torch::Tensor SmallCnnImpl::forward(const torch::Tensor& x) {
  const int64_t s = options_.image_size;
  TANDEM_CHECK_ARG(
      x.dim() == 4 && x.size(1) == options_.in_channels && x.size(2) == s && x.size(3) == s,
      "SmallCnn: input ", x.sizes(), " is not valid: expected (B, ", options_.in_channels, ", ", s,
      ", ", s, ")");
  namespace F = torch::nn::functional;
  auto y = bn2(conv2(bn1(conv1(x)).relu_())).relu_();
  y = F::max_pool2d(y, F::MaxPool2dFuncOptions(2));
  y = bn4(conv4(bn3(conv3(y)).relu_())).relu_();
  y = F::max_pool2d(y, F::MaxPool2dFuncOptions(2));
  y = y.flatten(1);
  return fc2(dropout(fc1(y).relu_()));
}

}  // namespace tandem::models
