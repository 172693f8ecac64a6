// The reference workloads' networks (seg and cls, docs/reference-workloads.md), as they train them:
// a 9-conv encoder that halves the image 8 times to (4096, 1, 1), the decoder that mirrors it back
// to per-pixel logits, and the classifier of the same encoder plus a linear head. Plain
// nn::Sequential stacks: their state_dict keys are the Python reference loops'
// (benchmarks/reference_loops.py: its seg encoder / decoder layers by index). Their largest
// layers are GatheredGrad (the encoder's last conv, the decoder's first two): the same layers with
// one process, and under data parallel weight gradients formed from every rank's gathered batch.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace tandem::models {

/// Conv2d(3->16, k1), then eight Conv2d k2 s2 doubling 16->4096; ReLU after all but the last.
/// (N, 3, 256, 256) float -> (N, 4096, 1, 1). 44,746,784 parameters.
torch::nn::Sequential reference_seg_encoder();
/// Eight ConvTranspose2d k2 s2 halving 4096->16, ReLU after each, then Conv2d(16->classes, k3,
/// p1). (N, 4096, 1, 1) -> (N, classes, 256, 256). 44,744,090 parameters at 10 classes.
torch::nn::Sequential reference_seg_decoder(int64_t classes = 10);
/// reference_seg_encoder()'s 9 convolutions, Flatten, Linear(4096 -> classes).
/// (N, 3, 256, 256) float -> (N, classes). 44,787,754 parameters at 10 classes.
torch::nn::Sequential reference_cls_net(int64_t classes = 10);

}  // namespace tandem::models
