// FoldedResNet: a frozen ResNet's convolutions with their batch norms folded in, run as cuDNN's
// fused conv + bias (+ add) + ReLU calls. See folded_resnet.h.
#include "tandem/models/folded_resnet.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/adaptive_avg_pool2d.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/cudnn_convolution_add_relu.h>
#include <ATen/ops/cudnn_convolution_relu.h>
#include <ATen/ops/max_pool2d.h>
#include <c10/util/Exception.h>

#include <array>
#include <iostream>
#include <string>
#include <variant>

#include "tandem/error.h"

namespace tandem::models {
namespace {

// conv followed by BN in eval mode, y = gamma * (conv(x) - mean) / sqrt(var + eps) + beta, as one
// convolution: weights scaled by s = gamma / sqrt(var + eps) per output channel and the bias
// beta - mean * s. Computed in float64, then cast once.
template <typename Conv>
Conv fold_pair(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& bn,
               at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const auto& o = conv.options;
  TANDEM_CHECK_ARG(o.groups() == 1 && (*o.dilation())[0] == 1 && (*o.dilation())[1] == 1 &&
                       (*o.stride())[0] == (*o.stride())[1],
                   "FoldedResNet folds plain convolutions (groups 1, dilation 1, square stride)");
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  TANDEM_CHECK_ARG(padding && (**padding)[0] == (**padding)[1],
                   "FoldedResNet folds convolutions with a square numeric padding");
  TANDEM_CHECK_ARG(bn.running_mean.defined() && bn.running_var.defined() && bn.weight.defined(),
                   "FoldedResNet needs batch norms with running statistics and an affine map");
  const at::Tensor scale = bn.weight.detach().to(at::kDouble) /
                           (bn.running_var.to(at::kDouble) + bn.options.eps()).sqrt();
  at::Tensor bias = bn.bias.detach().to(at::kDouble) - bn.running_mean.to(at::kDouble) * scale;
  if (conv.bias.defined()) bias = bias + conv.bias.detach().to(at::kDouble) * scale;
  const at::Tensor& w = conv.weight;
  Conv out;
  // The module's layout (channels-last after to_channels_last): cuDNN then copies nothing.
  out.weight = (w.detach().to(at::kDouble) * scale.view({-1, 1, 1, 1}))
                   .to(dtype)
                   .contiguous(w.suggest_memory_format());
  out.bias = bias.to(dtype).contiguous();
  out.stride = (*o.stride())[0];
  out.padding = (**padding)[0];
  return out;
}

const torch::nn::Conv2dImpl& conv_at(const torch::nn::Sequential& s, size_t i) {
  return *s->ptr(i)->as<torch::nn::Conv2dImpl>();
}
const torch::nn::BatchNorm2dImpl& bn_at(const torch::nn::Sequential& s, size_t i) {
  return *s->ptr(i)->as<torch::nn::BatchNorm2dImpl>();
}

}  // namespace

FoldedResNet::FoldedResNet(ResNet net, FoldedResNetOptions options)
    : net_(std::move(net)), options_(options) {
  TANDEM_CHECK_ARG(net_, "FoldedResNet was given no ResNet");
  const at::ScalarType t = options_.dtype;
  TANDEM_CHECK_ARG(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
                   "FoldedResNet runs in float32, bfloat16 or float16, not ", t);
}

void FoldedResNet::fold() {
  const at::ScalarType t = options_.dtype;
  stem_ = fold_pair<Conv>(*net_->conv1, *net_->bn1, t);
  blocks_.clear();
  for (const auto* layer : {&net_->layer1, &net_->layer2, &net_->layer3, &net_->layer4}) {
    for (const auto& child : (*layer)->children()) {
      Block b;
      torch::nn::Sequential downsample{nullptr};
      if (const auto* basic = child->as<BasicBlockImpl>()) {
        b.convs = {fold_pair<Conv>(*basic->conv1, *basic->bn1, t),
                   fold_pair<Conv>(*basic->conv2, *basic->bn2, t)};
        downsample = basic->downsample;
      } else if (const auto* bottleneck = child->as<BottleneckImpl>()) {
        b.convs = {fold_pair<Conv>(*bottleneck->conv1, *bottleneck->bn1, t),
                   fold_pair<Conv>(*bottleneck->conv2, *bottleneck->bn2, t),
                   fold_pair<Conv>(*bottleneck->conv3, *bottleneck->bn3, t)};
        downsample = bottleneck->downsample;
      } else {
        TANDEM_CHECK_ARG(false, "FoldedResNet: a layer holds a ", child->name(),
                         ", expected BasicBlock or Bottleneck");
      }
      if (downsample) {
        b.has_downsample = true;
        b.downsample = fold_pair<Conv>(conv_at(downsample, 0), bn_at(downsample, 1), t);
      }
      blocks_.push_back(std::move(b));
    }
  }
}

at::Tensor FoldedResNet::conv(Conv& c, const at::Tensor& x, bool relu, const at::Tensor* add) {
  const std::array<int64_t, 2> stride{c.stride, c.stride}, padding{c.padding, c.padding},
      dilation{1, 1};
  c.fused_last = false;
  if (options_.fuse && relu && c.fused_ok && x.is_cuda()) {
    // cuDNN computes relu(conv(x) + alpha * add + bias) in one kernel; its runtime-fusion
    // engines may refuse a shape (a 3-channel input, say) with a cuDNN status, not a CUDA error,
    // at the first (eager) call, before any capture: that convolution runs unfused from then on.
    try {
      at::Tensor y =
          add ? at::cudnn_convolution_add_relu(x, c.weight, *add, 1, c.bias, stride, padding,
                                               dilation, 1)
              : at::cudnn_convolution_relu(x, c.weight, c.bias, stride, padding, dilation, 1);
      c.fused_last = true;
      return y;
    } catch (const c10::Error& e) {
      c.fused_ok = false;
      std::cerr << "FoldedResNet: cuDNN's fused convolution refused a " << c.weight.sizes()
                << " convolution on " << x.sizes() << " (" << first_line(e.what())
                << "); it runs as separate ops\n";
    }
  }
  at::Tensor y = at::conv2d(x, c.weight, c.bias, stride, padding);
  if (add) y.add_(*add);
  if (relu) y.relu_();
  return y;
}

at::Tensor FoldedResNet::feature_map(const at::Tensor& input) {
  TANDEM_CHECK_ARG(input.dim() == 4 && input.size(1) == 3,
                   "FoldedResNet: expected input (B, 3, H, W), got ", input.sizes());
  std::call_once(folded_, [this] { fold(); });
  at::NoGradGuard no_grad;
  at::Tensor x = conv(stem_, input.to(options_.dtype), /*relu=*/true, nullptr);
  x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  for (Block& b : blocks_) {
    const at::Tensor identity =
        b.has_downsample ? conv(b.downsample, x, /*relu=*/false, nullptr) : x;
    at::Tensor y = x;
    for (size_t i = 0; i + 1 < b.convs.size(); ++i) y = conv(b.convs[i], y, /*relu=*/true, nullptr);
    x = conv(b.convs.back(), y, /*relu=*/true, &identity);
  }
  return x;
}

at::Tensor FoldedResNet::features(const at::Tensor& x) {
  return at::adaptive_avg_pool2d(feature_map(x), {1, 1}).flatten(1);
}

int64_t FoldedResNet::convolutions() const {
  int64_t n = blocks_.empty() ? 0 : 1;
  for (const Block& b : blocks_) n += static_cast<int64_t>(b.convs.size()) + b.has_downsample;
  return n;
}

int64_t FoldedResNet::fused_convolutions() const {
  int64_t n = stem_.fused_last;
  for (const Block& b : blocks_) {
    for (const Conv& c : b.convs) n += c.fused_last;
    n += b.has_downsample && b.downsample.fused_last;
  }
  return n;
}

}  // namespace tandem::models
