// The reference workloads' networks (reference_nets.h).
#include "tandem/models/reference_nets.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "tandem/gathered_grad.h"

namespace tandem::models {

namespace nn = torch::nn;

torch::nn::Sequential reference_seg_encoder() {
  nn::Sequential seq;
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(3, 16, 1)));
  seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  int64_t c = 16;
  for (int i = 0; i < 8; ++i, c *= 2) {
    nn::Conv2d conv(nn::Conv2dOptions(c, c * 2, 2).stride(2));
    // The last (2048 -> 4096 on 2x2, a 134 MB weight): under data parallel its gradient comes
    // from the gathered batch, 12,288 floats a sample (gathered_grad.h).
    if (i == 7)
      seq->push_back(GatheredGrad(conv));
    else
      seq->push_back(conv);
    if (i < 7) seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  return seq;
}

torch::nn::Sequential reference_seg_decoder(int64_t classes) {
  nn::Sequential seq;
  int64_t c = 4096;
  for (int i = 0; i < 8; ++i, c /= 2) {
    nn::ConvTranspose2d deconv(nn::ConvTranspose2dOptions(c, c / 2, 2).stride(2));
    // The first two (134 and 34 MB of weights on 1x1 and 2x2 inputs), whose gradients backward
    // computes last: under data parallel they come from the gathered batch (gathered_grad.h)
    // instead of an all-reduce that nothing would be left to hide behind.
    if (i < 2)
      seq->push_back(GatheredGrad(deconv));
    else
      seq->push_back(deconv);
    seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(16, classes, 3).padding(1)));
  return seq;
}

torch::nn::Sequential reference_cls_net(int64_t classes) {
  nn::Sequential seq = reference_seg_encoder();  // the same 9-conv stack
  seq->push_back(nn::Flatten());
  seq->push_back(nn::Linear(4096, classes));
  return seq;
}

}  // namespace tandem::models
