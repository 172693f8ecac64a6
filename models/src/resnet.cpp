// torchvision's ResNet (torchvision/models/resnet.py) transcribed to torch::nn: the same
// children under the same names, in the same registration order, and the same initialization.
#include "tandem/models/resnet.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/conv2d.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>

#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "tandem/error.h"
#include "tandem/models/batch_norm_relu.h"
#include "tandem/models/cast_together.h"
#include "tandem/models/conv_with_stats.h"
#include "tandem/models/max_pool.h"
#include "tandem/models/tuned_conv.h"

namespace tandem::models {
namespace {

namespace F = torch::nn::functional;

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

torch::nn::Conv2d conv1x1(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

// torchvision's downsample: where a block changes the spatial size or the channel count, the
// identity path is projected by a strided 1x1 conv and a BN. Children "0" and "1".
torch::nn::Sequential downsample_or_null(int64_t inplanes, int64_t out, int64_t stride) {
  if (stride == 1 && inplanes == out) return nullptr;
  return torch::nn::Sequential(conv1x1(inplanes, out, stride), torch::nn::BatchNorm2d(out));
}

struct NameAndFactory {
  const char* name;
  ResNet (*make)(ResNetOptions);
};
constexpr NameAndFactory kFactories[] = {
    {"resnet18", resnet18},
    {"resnet34", resnet34},
    {"resnet50", resnet50},
};

void append_state_dict_keys(const torch::nn::Module& module, const std::string& prefix,
                            std::vector<std::string>& keys) {
  // named_parameters / named_buffers with recurse=false already skip undefined tensors; the
  // defined() checks say so where a reader looks for it.
  for (const auto& item : module.named_parameters(/*recurse=*/false))
    if (item.value().defined()) keys.push_back(prefix + item.key());
  for (const auto& item : module.named_buffers(/*recurse=*/false))
    if (item.value().defined()) keys.push_back(prefix + item.key());
  for (const auto& child : module.named_children())
    append_state_dict_keys(*child.value(), prefix + child.key() + ".", keys);
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  downsample = downsample_or_null(inplanes, planes * kExpansion, stride);
  if (downsample) register_module("downsample", downsample);
}

namespace {
// How a block's batch norms run: fused with their ReLU (and add) in training on a GPU (batch
// statistics, batch_norm_relu), through the same kernels in eval mode on a GPU without
// gradients (running statistics, batch_norm_relu_eval: an evaluation launches only kernels the
// training has loaded, in one pass instead of three), else as LibTorch's modules (the CPU, and
// eval mode with gradients: a frozen batch norm under fine-tuning).
enum class BnPath { kModules, kTraining, kEval };

BnPath bn_path(bool wanted, bool training, const torch::Tensor& x) {
  if (!wanted || !x.is_cuda()) return BnPath::kModules;
  if (training) return BnPath::kTraining;
  return at::GradMode::is_enabled() ? BnPath::kModules : BnPath::kEval;
}

torch::Tensor bn_relu(BnPath path, const ConvAndSums& x, torch::nn::BatchNorm2dImpl& bn,
                      const torch::Tensor& residual = {}) {
  return path == BnPath::kTraining ? batch_norm_relu(x.y, bn, residual, x.sums)
                                   : batch_norm_relu_eval(x.y, bn, residual);
}

// The convolution weights a fused training forward runs with. Under autocast to a lower
// precision every convolution's float32 weight is cast ahead, a layer's at a time
// (cast_together: one launch a layer, and one for its gradients back, where autocast launches
// two a convolution); else, and for a convolution not cast, the module's own forward.
class ConvWeights {
 public:
  // The modules' own weights.
  ConvWeights() = default;

  // The modules' own weights on tuned_conv2d's kept plans where `plans` (autocast's cast made
  // there): an evaluation's forward, which runs the shapes its training timed plans for, where
  // the module's at::conv2d would time each of them again on the thread that evaluates.
  static ConvWeights modules_on_plans(bool plans) {
    ConvWeights w;
    w.plans_ = plans;
    w.modules_on_plans_ = plans;
    return w;
  }

  // Casts for `net`'s convolutions where autocast would cast them (on CUDA to a dtype other than
  // float32, with gradients recorded): the stem's and each layer's in groups, so a layer's
  // weight gradients are ready when that layer's backward ends.
  // `stats`: the convolutions before a batch norm give its sums too (conv_and_sums); `plans`:
  // the cast convolutions run on tuned_conv2d's kept plans.
  static ConvWeights for_autocast(ResNetImpl& net, bool stats, bool plans) {
    ConvWeights w;
    w.stats_ = stats;
    w.plans_ = plans;
    if (!at::autocast::is_autocast_enabled(at::kCUDA) || !at::GradMode::is_enabled()) return w;
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    if (dtype == at::kFloat || !net.conv1->weight.is_cuda()) return w;
    w.cast_group(std::vector<torch::nn::Conv2dImpl*>{net.conv1.get()}, dtype);
    for (const auto* layer : {&net.layer1, &net.layer2, &net.layer3, &net.layer4}) {
      std::vector<torch::nn::Conv2dImpl*> convs;
      for (const auto& module : (*layer)->modules(/*include_self=*/false))
        if (auto* conv = module->as<torch::nn::Conv2dImpl>()) convs.push_back(conv);
      w.cast_group(convs, dtype);
    }
    return w;
  }

  // conv(x) with its cast weight where there is one: the op the module's forward runs, on the
  // weight autocast would have cast; on the kept plans where asked for (a module's own weight
  // only where modules_on_plans).
  torch::Tensor conv(torch::nn::Conv2dImpl& conv, const torch::Tensor& x) const {
    const auto found = cast_.find(&conv);
    const bool cast = found != cast_.end();
    if (!cast && (!modules_on_plans_ || !plannable(conv))) return conv.forward(x);
    const torch::Tensor& weight = cast ? found->second : conv.weight;
    const auto& o = conv.options;
    const auto& padding = *std::get_if<torch::ExpandingArray<2>>(&o.padding());
    if (plans_)
      return tuned_conv2d(x, weight, conv.bias, *o.stride(), *padding, *o.dilation(), o.groups());
    return at::conv2d(x, weight, conv.bias, o.stride(), padding, o.dilation(), o.groups());
  }

  // conv(x) and, where asked for and one cuDNN graph gives them (conv2d_with_stats), its
  // output's per-channel sums for the batch norm that follows; else no sums. Every ResNet
  // convolution's input but the stem's is a ReLU's output.
  ConvAndSums conv_and_sums(torch::nn::Conv2dImpl& conv, const torch::Tensor& x,
                            bool input_nonnegative = true) const {
    const auto found = cast_.find(&conv);
    const auto& o = conv.options;
    const auto& dilation = *o.dilation();
    // Where the statistics graph does not apply, this->conv: the same at::conv2d
    // conv2d_with_stats would fall back to, or the kept plans.
    if (!stats_ || found == cast_.end() || conv.bias.defined() || dilation[0] != 1 ||
        dilation[1] != 1 || o.groups() != 1 || !conv2d_with_stats_applies(x, found->second))
      return {this->conv(conv, x), {}};
    return conv2d_with_stats(x, found->second, o.stride(),
                             *std::get_if<torch::ExpandingArray<2>>(&o.padding()),
                             input_nonnegative, /*kept_plans=*/plans_);
  }

 private:
  // A CUDA weight with zero padding given as numbers (every ResNet convolution's).
  static bool plannable(const torch::nn::Conv2dImpl& conv) {
    return conv.weight.is_cuda() &&
           std::holds_alternative<torch::enumtype::kZeros>(conv.options.padding_mode()) &&
           std::holds_alternative<torch::ExpandingArray<2>>(conv.options.padding());
  }

  // The same, in float32: a weight autocast would cast.
  static bool castable(const torch::nn::Conv2dImpl& conv) {
    return conv.weight.scalar_type() == at::kFloat && plannable(conv);
  }

  void cast_group(const std::vector<torch::nn::Conv2dImpl*>& convs, at::ScalarType dtype) {
    std::vector<torch::nn::Conv2dImpl*> taken;
    std::vector<torch::Tensor> weights;
    for (auto* conv : convs) {
      if (!castable(*conv)) continue;
      taken.push_back(conv);
      weights.push_back(conv->weight);
    }
    const std::vector<torch::Tensor> cast = cast_together(weights, dtype);
    for (size_t i = 0; i < taken.size(); ++i) cast_[taken[i]] = cast[i];
  }

  std::unordered_map<const torch::nn::Conv2dImpl*, torch::Tensor> cast_;
  bool stats_ = false;
  bool plans_ = false;
  bool modules_on_plans_ = false;
};

// The identity path of a fused block: x, or the downsample's conv and its batch norm through
// the fused kernels (no ReLU).
torch::Tensor fused_identity(BnPath path, const torch::nn::Sequential& downsample,
                             const torch::Tensor& x, const ConvWeights& w = {}) {
  if (!downsample) return x;
  auto conv = downsample->ptr(0)->as<torch::nn::Conv2dImpl>();
  auto bn = downsample->ptr(1)->as<torch::nn::BatchNorm2dImpl>();
  if (path != BnPath::kTraining) return batch_norm_relu_eval(w.conv(*conv, x), *bn, {}, false);
  const ConvAndSums y = w.conv_and_sums(*conv, x);
  return batch_norm_train(y.y, *bn, y.sums);
}

// The fused path of a block up to its last batch norm: every batch norm but the last with its
// ReLU, then the last convolution's output (the last batch norm's input, with its sums where the
// convolution gave them), which forward and block_twice finish with the identity path their
// own way.
ConvAndSums last_bn_input(BnPath path, BasicBlockImpl& b, const torch::Tensor& x,
                          const ConvWeights& w = {}) {
  return w.conv_and_sums(*b.conv2, bn_relu(path, w.conv_and_sums(*b.conv1, x), *b.bn1));
}

ConvAndSums last_bn_input(BnPath path, BottleneckImpl& b, const torch::Tensor& x,
                          const ConvWeights& w = {}) {
  const torch::Tensor out = bn_relu(path, w.conv_and_sums(*b.conv1, x), *b.bn1);
  return w.conv_and_sums(*b.conv3, bn_relu(path, w.conv_and_sums(*b.conv2, out), *b.bn2));
}

// A block on the fused kernels (training, or evaluating without gradients), its input once.
template <typename Block>
torch::Tensor fused_block(BnPath path, Block& b, torch::nn::BatchNorm2dImpl& last_bn,
                          const torch::Tensor& x, const ConvWeights& w = {}) {
  return bn_relu(path, last_bn_input(path, b, x, w), last_bn,
                 fused_identity(path, b.downsample, x, w));
}

// A block training on the fused kernels, its input given twice (`x` for conv1, `identity` for
// the residual path: the same values, the previous op's two outputs) and its output returned
// twice (batch_norm_relu_twice): the next block's two uses of it send their gradients back
// apart, and the backward of its last batch norm sums them in its first pass.
using TensorPair = std::pair<torch::Tensor, torch::Tensor>;

template <typename Block>
TensorPair fused_block_twice(Block& b, torch::nn::BatchNorm2dImpl& last_bn, const torch::Tensor& x,
                             const torch::Tensor& identity, const ConvWeights& w) {
  const ConvAndSums last_input = last_bn_input(BnPath::kTraining, b, x, w);
  return batch_norm_relu_twice(last_input.y, last_bn,
                               fused_identity(BnPath::kTraining, b.downsample, identity, w),
                               last_input.sums);
}

// One block of a layer in training on a GPU: fused and given its input twice where its batch
// norms are fused, else its own forward (whose output serves both uses).
TensorPair block_twice(const std::shared_ptr<torch::nn::Module>& block, const TensorPair& in,
                       const ConvWeights& w) {
  torch::Tensor y;
  if (auto* basic = block->as<BasicBlockImpl>()) {
    if (basic->fused_batch_norm)
      return fused_block_twice(*basic, *basic->bn2, in.first, in.second, w);
    y = basic->forward(in.first);
  } else {
    auto* bottleneck = block->as<BottleneckImpl>();
    TANDEM_CHECK_ARG(bottleneck != nullptr, "ResNet: a layer holds a block of another kind");
    if (bottleneck->fused_batch_norm)
      return fused_block_twice(*bottleneck, *bottleneck->bn3, in.first, in.second, w);
    y = bottleneck->forward(in.first);
  }
  return {y, y};
}

// One block of a layer evaluating on a GPU without gradients: fused where its batch norms are,
// its convolutions on `w`; else its own forward.
torch::Tensor block_eval(const std::shared_ptr<torch::nn::Module>& block, const torch::Tensor& x,
                         const ConvWeights& w) {
  if (auto* basic = block->as<BasicBlockImpl>())
    return basic->fused_batch_norm ? fused_block(BnPath::kEval, *basic, *basic->bn2, x, w)
                                   : basic->forward(x);
  auto* bottleneck = block->as<BottleneckImpl>();
  TANDEM_CHECK_ARG(bottleneck != nullptr, "ResNet: a layer holds a block of another kind");
  return bottleneck->fused_batch_norm
             ? fused_block(BnPath::kEval, *bottleneck, *bottleneck->bn3, x, w)
             : bottleneck->forward(x);
}
}  // namespace

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  if (const BnPath path = bn_path(fused_batch_norm, is_training(), x); path != BnPath::kModules)
    return fused_block(path, *this, *bn2, x);
  auto out = bn1(conv1(x)).relu_();
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu_(out);
}

BottleneckImpl::BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride) {
  // torchvision's width = planes * (base_width / 64) * groups, which is `planes` for ResNet-50
  // (base_width 64, groups 1); the wide and ResNeXt variants are not built here.
  const int64_t width = planes;
  conv1 = register_module("conv1", conv1x1(inplanes, width, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(width));
  conv3 = register_module("conv3", conv1x1(width, planes * kExpansion, 1));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
  downsample = downsample_or_null(inplanes, planes * kExpansion, stride);
  if (downsample) register_module("downsample", downsample);
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  if (const BnPath path = bn_path(fused_batch_norm, is_training(), x); path != BnPath::kModules)
    return fused_block(path, *this, *bn3, x);
  auto out = bn1(conv1(x)).relu_();
  out = bn2(conv2(out)).relu_();
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu_(out);
}

ResNetImpl::ResNetImpl(ResNetBlock block, std::array<int64_t, 4> blocks, ResNetOptions options) {
  TANDEM_CHECK_ARG(options.num_classes >= 1, "ResNet: num_classes must be >= 1, got ",
                   options.num_classes);
  for (size_t i = 0; i < blocks.size(); ++i)
    TANDEM_CHECK_ARG(blocks[i] >= 1, "ResNet: layer", i + 1, " needs at least 1 block, got ",
                     blocks[i]);
  const int64_t expansion =
      block == ResNetBlock::kBasic ? BasicBlockImpl::kExpansion : BottleneckImpl::kExpansion;
  fused_batch_norm_ = options.fused_batch_norm;
  cast_weights_together_ = options.cast_weights_together;
  stats_in_convolutions_ = options.stats_in_convolutions;
  kept_conv_plans_ = options.kept_conv_plans;

  conv1 = register_module(
      "conv1",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
  layer1 = register_module("layer1", make_layer(block, 64, blocks[0], 1));
  layer2 = register_module("layer2", make_layer(block, 128, blocks[1], 2));
  layer3 = register_module("layer3", make_layer(block, 256, blocks[2], 2));
  layer4 = register_module("layer4", make_layer(block, 512, blocks[3], 2));
  feature_dim_ = 512 * expansion;
  fc = register_module("fc", torch::nn::Linear(feature_dim_, options.num_classes));

  // Every conv and BN already has LibTorch's default init from its constructor; torchvision
  // then overwrites them in pre-order (self.modules()), and so do we, from the default generator.
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, /*a=*/0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
}

torch::nn::Sequential ResNetImpl::make_layer(ResNetBlock block, int64_t planes, int64_t count,
                                             int64_t stride) {
  // Only the first block strides and changes the width; the rest keep planes * expansion.
  torch::nn::Sequential layer;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = i == 0 ? stride : 1;
    if (block == ResNetBlock::kBasic) {
      BasicBlock b(inplanes_, planes, s);
      b->fused_batch_norm = fused_batch_norm_;
      layer->push_back(b);
      inplanes_ = planes * BasicBlockImpl::kExpansion;
    } else {
      Bottleneck b(inplanes_, planes, s);
      b->fused_batch_norm = fused_batch_norm_;
      layer->push_back(b);
      inplanes_ = planes * BottleneckImpl::kExpansion;
    }
  }
  return layer;
}

torch::Tensor ResNetImpl::feature_map(const torch::Tensor& x) {
  TANDEM_CHECK_ARG(x.dim() == 4 && x.size(1) == 3, "ResNet: expected input (B, 3, H, W), got ",
                   x.sizes());
  const BnPath path = bn_path(fused_batch_norm_, is_training(), x);
  if (path == BnPath::kTraining) {
    // Each block's output goes to the next block twice (batch_norm_relu_twice); the stem's max
    // pool's once, its two uses' gradients added by autograd.
    const ConvWeights w =
        cast_weights_together_
            ? ConvWeights::for_autocast(*this, stats_in_convolutions_, kept_conv_plans_)
            : ConvWeights();
    const torch::Tensor stem = max_pool_3x3_stride2(
        bn_relu(path, w.conv_and_sums(*conv1, x, /*input_nonnegative=*/false), *bn1));
    TensorPair y{stem, stem};
    for (const auto* layer : {&layer1, &layer2, &layer3, &layer4})
      for (const auto& block : (*layer)->children()) y = block_twice(block, y, w);
    return y.first;
  }
  if (path == BnPath::kEval) {
    const ConvWeights w = ConvWeights::modules_on_plans(kept_conv_plans_);
    torch::Tensor y = max_pool_3x3_stride2(bn_relu(path, {w.conv(*conv1, x), {}}, *bn1));
    for (const auto* layer : {&layer1, &layer2, &layer3, &layer4})
      for (const auto& block : (*layer)->children()) y = block_eval(block, y, w);
    return y;
  }
  const torch::Tensor y =
      F::max_pool2d(bn1(conv1(x)).relu_(), F::MaxPool2dFuncOptions(3).stride(2).padding(1));
  return layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
}

torch::Tensor ResNetImpl::features(const torch::Tensor& x) {
  auto y = F::adaptive_avg_pool2d(feature_map(x), F::AdaptiveAvgPool2dFuncOptions(1));
  return y.flatten(1);  // (B, feature_dim)
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& x) { return fc(features(x)); }

ResNet resnet18(ResNetOptions options) {
  return ResNet(ResNetBlock::kBasic, std::array<int64_t, 4>{2, 2, 2, 2}, options);
}

ResNet resnet34(ResNetOptions options) {
  return ResNet(ResNetBlock::kBasic, std::array<int64_t, 4>{3, 4, 6, 3}, options);
}

ResNet resnet50(ResNetOptions options) {
  return ResNet(ResNetBlock::kBottleneck, std::array<int64_t, 4>{3, 4, 6, 3}, options);
}

std::vector<std::string> resnet_names() {
  std::vector<std::string> names;
  for (const auto& f : kFactories) names.emplace_back(f.name);
  return names;
}

ResNet resnet(const std::string& name, ResNetOptions options) {
  for (const auto& f : kFactories)
    if (name == f.name) return f.make(options);
  std::ostringstream valid;
  for (const auto& f : kFactories) valid << (&f == kFactories ? "" : ", ") << f.name;
  TANDEM_CHECK_ARG(false, "unknown ResNet '", name, "'; expected one of: ", valid.str());
  return nullptr;  // not reached
}

std::vector<std::string> state_dict_keys(const torch::nn::Module& module) {
  std::vector<std::string> keys;
  append_state_dict_keys(module, "", keys);
  return keys;
}

void to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  for (auto& b : module.buffers())
    if (b.dim() == 4) b.set_data(b.data().contiguous(at::MemoryFormat::ChannelsLast));
}

}  // namespace tandem::models
