// torchvision's ResNet-18/34/50 in LibTorch's C++ frontend, with torchvision's child names, so
// its state_dict keys ("layer2.0.downsample.1.running_var", ...) are torchvision's and weights
// saved from Python (safetensors, by name) load into it unchanged.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::models {

struct ResNetOptions {
  /// Outputs of the classifier `fc` (torchvision's default: ImageNet's 1000). Must be >= 1.
  int64_t num_classes = 1000;
  /// In training mode on a GPU, each batch norm with the ReLU (and the residual add) after it
  /// runs as one op (batch_norm_relu.h: one pass writes the activation), a downsample's batch
  /// norm through the same kernels, and the stem's max pool as tandem's own (max_pool.h); in
  /// eval mode without gradients (an evaluation) the same kernels apply the running
  /// statistics. false: LibTorch's BatchNorm2d, add, ReLU and max pool one after another.
  /// Same parameters, buffers and state_dict.
  bool fused_batch_norm = true;
  /// With fused_batch_norm, training on a GPU under autocast to a lower precision: every
  /// convolution's float32 weight cast a layer at a time (cast_together.h: one launch a layer
  /// and one for its gradients back) instead of autocast's two launches a convolution. The same
  /// values; a layer's weight gradients arrive together when its backward ends. false:
  /// autocast's own casts.
  bool cast_weights_together = true;
  /// With fused_batch_norm and cast_weights_together, training on a GPU under autocast to half:
  /// each convolution before a batch norm also gives its output's per-channel sums from its own
  /// epilogue (conv_with_stats.h: one cuDNN graph), and the batch norm finalizes them instead of
  /// reading the activation for its statistics. Where cuDNN has no such graph (bf16 on Hopper,
  /// say) the convolutions run as without it. false: the batch norms read their inputs.
  bool stats_in_convolutions = true;
  /// With fused_batch_norm and cast_weights_together, training on a GPU under autocast with
  /// cuDNN's benchmark mode on: the convolutions that do not give sums run on tuned_conv.h's
  /// plans — timed once a shape for the whole process (at::conv2d's cudnn.benchmark times them
  /// again on every thread that runs the net) and rebuilt from a plans file a KeptConvPlans
  /// reads — instead of at::conv2d, and those that give sums take their gradients from the
  /// same plans. With fused_batch_norm, an evaluation (eval mode, no gradients, on a GPU) runs
  /// its convolutions on the same plans: the shapes its training timed, not timed again on the
  /// thread that evaluates. The same values within the kernels' rounding. false: at::conv2d,
  /// and LibTorch's convolution backward behind the sums' graph.
  bool kept_conv_plans = true;
};

/// The residual block of ResNet-18/34: two 3x3 convs, `expansion` 1. Children, in torchvision's
/// order: conv1, bn1, conv2, bn2 and, where the shape changes, downsample (0: 1x1 conv, 1: BN).
class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  /// `stride` (1 or 2) is on conv1; `inplanes` in, `planes` out.
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride);
  /// (B, inplanes, H, W) -> (B, planes, H / stride, W / stride).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};  // null where the identity fits
  bool fused_batch_norm = true;               ///< ResNetOptions::fused_batch_norm
};
TORCH_MODULE(BasicBlock);

/// The residual block of ResNet-50, torchvision's "v1.5": 1x1 reduce, 3x3 (carrying the
/// stride, unlike the paper's v1 which strides the first 1x1), 1x1 expand by `kExpansion`.
/// Children: conv1, bn1, conv2, bn2, conv3, bn3 and, where the shape changes, downsample.
class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride);
  /// (B, inplanes, H, W) -> (B, 4 * planes, H / stride, W / stride).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};  // null where the identity fits
  bool fused_batch_norm = true;               ///< ResNetOptions::fused_batch_norm
};
TORCH_MODULE(Bottleneck);

enum class ResNetBlock { kBasic, kBottleneck };

/// conv1 (7x7/2) · bn1 · relu · maxpool (3/2/1) · layer1..layer4 · adaptive avg pool (1x1) · fc.
/// Children in torchvision's order: conv1, bn1, layer1, layer2, layer3, layer4, fc; relu and
/// the pools hold no state, so they are calls rather than children (the state_dict is the same).
/// Initialized as torchvision does: conv weights kaiming_normal_(fan_out, relu), BN weight 1 and
/// bias 0, fc LibTorch's (= PyTorch's) default Linear init; draws from the default generator.
class ResNetImpl : public torch::nn::Module {
 public:
  /// `blocks`: how many blocks in layer1..layer4 (each >= 1), e.g. {2, 2, 2, 2} for ResNet-18.
  /// Throws InvalidArgument for a count < 1 or num_classes < 1.
  ResNetImpl(ResNetBlock block, std::array<int64_t, 4> blocks, ResNetOptions options = {});

  /// Logits: (B, 3, H, W) float -> (B, num_classes). Runs on the caller's current stream;
  /// capture-safe (no host sync: the input check reads only sizes). Any H, W >= 1 works (the
  /// five stride-2 stages round up; 224 gives 7x7 before the pool). Throws InvalidArgument for
  /// an input that is not (B, 3, H, W).
  torch::Tensor forward(const torch::Tensor& x);
  /// The pooled features fc reads: (B, 3, H, W) -> (B, feature_dim()). Same lane and
  /// capture-safety as forward.
  torch::Tensor features(const torch::Tensor& x);
  /// layer4's output before the pool, (B, 3, H, W) -> (B, feature_dim(), ~H/32, ~W/32): what a
  /// segmentation head reads (fcn.h).
  torch::Tensor feature_map(const torch::Tensor& x);
  /// 512 for BasicBlock nets (18/34), 2048 for Bottleneck ones (50): fc's in_features.
  int64_t feature_dim() const { return feature_dim_; }

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  /// The classifier, (feature_dim) -> (num_classes). For another head, replace the registered
  /// child and the member together (assigning the member alone leaves the old one in the
  /// state_dict): `net->fc = net->replace_module("fc", torch::nn::Linear(net->feature_dim(), 10));`
  torch::nn::Linear fc{nullptr};

 private:
  torch::nn::Sequential make_layer(ResNetBlock block, int64_t planes, int64_t count,
                                   int64_t stride);

  int64_t inplanes_ = 64;  // channels into the next layer, as torchvision's self.inplanes
  int64_t feature_dim_ = 0;
  bool fused_batch_norm_ = true;
  bool cast_weights_together_ = true;
  bool stats_in_convolutions_ = true;
  bool kept_conv_plans_ = true;
};
TORCH_MODULE(ResNet);

/// torchvision's resnet18: BasicBlock, {2, 2, 2, 2}; 11,689,512 parameters at 1000 classes.
ResNet resnet18(ResNetOptions options = {});
/// torchvision's resnet34: BasicBlock, {3, 4, 6, 3}; 21,797,672 parameters at 1000 classes.
ResNet resnet34(ResNetOptions options = {});
/// torchvision's resnet50: Bottleneck (v1.5), {3, 4, 6, 3}; 25,557,032 parameters.
ResNet resnet50(ResNetOptions options = {});
/// One of the above by name ("resnet18", "resnet34", "resnet50"); throws InvalidArgument naming
/// the bad name and listing the valid ones.
ResNet resnet(const std::string& name, ResNetOptions options = {});
/// The names resnet() accepts, in order of depth.
std::vector<std::string> resnet_names();

/// Lays every 4-D parameter and buffer of `module` out channels-last (NHWC strides, same
/// shapes and values), in place: with channels-last inputs, cuDNN's convolutions then run on
/// the tensor cores without layout transposes (most of bf16's gain on a ResNet). The state_dict
/// is unchanged: safetensors saves contiguous (NCHW) copies.
void to_channels_last(torch::nn::Module& module);

/// The keys PyTorch's module.state_dict() would give, in its order: for each module in
/// pre-order, its own parameters, then its own buffers, then its children's keys. (LibTorch's
/// named_parameters() and named_buffers() each walk the tree once, so concatenating them puts
/// every buffer after every parameter: not torchvision's order.) Undefined tensors (a bias-free
/// conv's "bias") are skipped, as PyTorch skips None.
std::vector<std::string> state_dict_keys(const torch::nn::Module& module);

}  // namespace tandem::models
