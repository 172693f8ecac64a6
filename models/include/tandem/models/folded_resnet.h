// A frozen ResNet for inference, with each batch norm folded into the convolution before it.
// A frozen backbone (trained weights, BatchNorm on its running statistics, no gradients) computes
// conv -> BN -> ReLU (-> + identity -> ReLU), where BN is a per-channel affine map: folding it
// into the convolution's weights and a bias leaves conv + bias (+ add) + ReLU, which cuDNN runs
// as one fused call (`at::cudnn_convolution_relu`, `at::cudnn_convolution_add_relu`; they have no
// backward, so they serve frozen stages only). No batch norm or ReLU pass over the activations is
// left: what torch.compile's fusions save, and the folded weights are already in the compute
// dtype, so no autocast casts either.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "tandem/models/resnet.h"

namespace tandem::models {

struct FoldedResNetOptions {
  /// The dtype the folded weights are kept in and the convolutions run in (the input is cast to
  /// it): float32, or bfloat16 / float16 as autocast would run the convolutions.
  at::ScalarType dtype = at::kFloat;
  /// true: conv + bias (+ add) + ReLU as one cuDNN call where the input is on a GPU (a
  /// convolution cuDNN's fused engines refuse falls back to the unfused ops at its first call,
  /// for good); false: the same arithmetic as separate ops (the reference).
  bool fuse = true;
};

/// The folded copy of a ResNet's backbone (its fc is not used). Folds at the first call, from the
/// module's weights then (so weights loaded before the first step are the ones used), and never
/// again: the module must stay frozen. Folding reorders arithmetic: in float32 on the CPU the
/// features stay within 1e-4 (relative to their largest magnitude) of the module's in eval mode
/// (models/folded_resnet_test).
class FoldedResNet {
 public:
  FoldedResNet(ResNet net, FoldedResNetOptions options = {});

  /// The pooled features, (B, 3, H, W) -> (B, feature_dim()) in options.dtype; the module's
  /// features() in eval mode. Runs on the current stream; capture-safe after its first call.
  at::Tensor features(const at::Tensor& x);
  /// layer4's output before the pool, (B, feature_dim(), ~H/32, ~W/32), in options.dtype.
  at::Tensor feature_map(const at::Tensor& x);
  int64_t feature_dim() const { return net_->feature_dim(); }
  /// How many convolutions ran as one fused cuDNN call at the last forward (0 before the first,
  /// or where nothing is fused), and how many there are.
  int64_t fused_convolutions() const;
  int64_t convolutions() const;

 private:
  struct Conv {
    at::Tensor weight, bias;  // BN folded in, options.dtype, the module's weight layout
    int64_t stride = 1, padding = 0;
    bool fused_ok = true;  // false once cuDNN's fused call refused this convolution
    bool fused_last = false;
  };
  struct Block {
    std::vector<Conv> convs;  // conv1, conv2 (, conv3): ReLU after each but the last
    bool has_downsample = false;
    Conv downsample;  // 1x1 conv with its BN folded, no ReLU
  };
  void fold();
  at::Tensor conv(Conv& c, const at::Tensor& x, bool relu, const at::Tensor* add);

  ResNet net_;
  FoldedResNetOptions options_;
  std::once_flag folded_;
  Conv stem_;
  std::vector<Block> blocks_;
};

}  // namespace tandem::models
