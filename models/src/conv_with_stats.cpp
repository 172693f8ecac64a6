// conv2d_with_stats: the autograd op over cuDNN's convolution + statistics graph
// (cudnn_conv_graphs.cpp), LibTorch's convolution backward behind it. See conv_with_stats.h.
#include "tandem/models/conv_with_stats.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include <iostream>
#include <string>
#include <tuple>

#include "cudnn_conv_graphs.h"
#include "tandem/error.h"
#include "tandem/models/tuned_conv.h"

namespace tandem::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ConvWithStats : public torch::autograd::Function<ConvWithStats> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               std::vector<int64_t> stride, std::vector<int64_t> padding,
                               bool input_nonnegative, bool kept_plans) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["kept_plans"] = kept_plans;
    at::Tensor y, sums;
    std::string why;
    if (!detail::cudnn_conv_with_stats(x, weight, stride, padding, input_nonnegative, y, sums,
                                       why)) {
      if (!why.empty())  // the shape's first time
        std::cerr << "conv2d_with_stats: cuDNN has no convolution + statistics graph for a "
                  << weight.sizes() << " convolution of " << x.sizes() << " here (" << why
                  << "); it runs as the convolution and a statistics pass\n";
      y = at::conv2d(x, weight, {}, stride, padding);
    }
    if (!sums.defined()) return {y, at::empty({0}, x.options().dtype(at::kFloat))};
    ctx->mark_non_differentiable({sums});
    return {y, sums};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    if (!grads[0].defined()) return variable_list(6);
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector(),
                               padding = ctx->saved_data["padding"].toIntVector();
    const at::Tensor dy = grads[0].contiguous(x.suggest_memory_format());
    at::Tensor dx, dw;
    if (ctx->saved_data["kept_plans"].toBool()) {
      std::tie(dx, dw) = tuned_conv2d_backward(dy, x, weight, stride, padding, {1, 1}, 1,
                                               ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    } else {
      auto [ldx, ldw, unused] = at::convolution_backward(
          dy, x, weight, std::nullopt, stride, padding, {1, 1}, false, {0, 0}, 1,
          {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
      dx = ldx;
      dw = ldw;
    }
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ConvAndSums conv2d_with_stats(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                              at::IntArrayRef padding, bool input_nonnegative, bool kept_plans) {
  TANDEM_CHECK_ARG(x.dim() == 4 && weight.dim() == 4 && x.size(1) == weight.size(1),
                   "conv2d_with_stats: expected x (N, C, H, W) and weight (K, C, R, S), got ",
                   x.sizes(), " and ", weight.sizes());
  TANDEM_CHECK_ARG(stride.size() == 2 && padding.size() == 2,
                   "conv2d_with_stats: expected two strides and two paddings, got ", stride,
                   " and ", padding);
  // Off the fused path, LibTorch's convolution as the caller would call it (under autocast it
  // casts x; the op below saves its inputs as given, so it takes only what it can run itself).
  if (!conv2d_with_stats_applies(x, weight))
    return {at::conv2d(x, weight, {}, stride, padding), at::Tensor()};
  variable_list out =
      ConvWithStats::apply(x, weight, stride.vec(), padding.vec(), input_nonnegative, kept_plans);
  return {out[0], out[1].numel() > 0 ? out[1] : at::Tensor()};
}

bool conv_with_stats_compiled() { return detail::cudnn_graphs_compiled(); }

bool conv2d_with_stats_applies(const at::Tensor& x, const at::Tensor& w) {
  return x.is_cuda() && x.scalar_type() == at::kHalf && w.scalar_type() == at::kHalf &&
         w.device() == x.device() && x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         w.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         at::globalContext().userEnabledCuDNN() && !at::globalContext().deterministicAlgorithms() &&
         detail::cudnn_graphs_compiled();
}

}  // namespace tandem::models
