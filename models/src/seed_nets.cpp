// The seed experiments' networks (seed_nets.h).
#include "tandem/models/seed_nets.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

namespace tandem::models {

namespace nn = torch::nn;

torch::nn::Sequential seed_seg_encoder() {
  nn::Sequential seq;
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(3, 16, 1)));
  seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  int64_t c = 16;
  for (int i = 0; i < 8; ++i, c *= 2) {
    seq->push_back(nn::Conv2d(nn::Conv2dOptions(c, c * 2, 2).stride(2)));
    if (i < 7) seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  return seq;
}

torch::nn::Sequential seed_seg_decoder(int64_t classes) {
  nn::Sequential seq;
  int64_t c = 4096;
  for (int i = 0; i < 8; ++i, c /= 2) {
    seq->push_back(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(c, c / 2, 2).stride(2)));
    seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(16, classes, 3).padding(1)));
  return seq;
}

torch::nn::Sequential seed_cls_net(int64_t classes) {
  nn::Sequential seq = seed_seg_encoder();  // SPEC: the same 9-conv stack
  seq->push_back(nn::Flatten());
  seq->push_back(nn::Linear(4096, classes));
  return seq;
}

}  // namespace tandem::models
