// batch_norm_relu: the autograd op over LibTorch's batch-norm statistics and backward kernels and
// tandem's fused apply kernel (kernels/bn_relu.cu); the CPU twin in ATen ops. See
// batch_norm_relu.h.
#include "tandem/models/batch_norm_relu.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>

#include <tuple>

#include "kernels/bn_relu_launch.h"
#include "tandem/error.h"

namespace tandem::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype the statistics and the apply compute in: float32, float64 for double input.
at::ScalarType compute_type(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);
}

at::Tensor per_channel(const at::Tensor& v) { return v.view({1, -1, 1, 1}); }

// LibTorch's CUDA batch-norm primitives take float, bfloat16 and float16 input in either
// layout; the fused apply kernel the same.
bool cuda_path(const at::Tensor& x) {
  const at::ScalarType t = x.scalar_type();
  return x.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

std::tuple<at::Tensor, at::Tensor> batch_stats(const at::Tensor& x, double eps) {
  if (cuda_path(x)) return at::batch_norm_stats(x, eps);  // float32 mean and 1/sqrt(var + eps)
  const at::Tensor xf = x.to(compute_type(x));
  const at::Tensor mean = xf.mean({0, 2, 3});
  const at::Tensor var = (xf - per_channel(mean)).square().mean({0, 2, 3});
  return {mean, (var + eps).rsqrt()};
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased variance.
void update_running(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& invstd,
                    torch::nn::BatchNorm2dImpl& bn, double momentum, double eps, int64_t n) {
  at::NoGradGuard no_grad;
  if (cuda_path(x)) {
    // One kernel: SyncBatchNorm's gather over one "rank" of n samples.
    at::batch_norm_gather_stats_with_counts(x, mean.unsqueeze(0), invstd.unsqueeze(0),
                                            bn.running_mean, bn.running_var, momentum, eps,
                                            at::full({1}, static_cast<double>(n), mean.options()));
  } else {
    const at::Tensor var = invstd.pow(-2) - eps;
    const at::Tensor unbiased = var * (static_cast<double>(n) / std::max<int64_t>(n - 1, 1));
    bn.running_mean.mul_(1 - momentum).add_(mean.to(bn.running_mean.scalar_type()), momentum);
    bn.running_var.mul_(1 - momentum).add_(unbiased.to(bn.running_var.scalar_type()), momentum);
  }
  bn.num_batches_tracked.add_(1);
}

models::BnDtype kernel_dtype(at::ScalarType t) {
  return t == at::kBFloat16 ? BnDtype::kBFloat16 : t == at::kHalf ? BnDtype::kHalf
                                                                  : BnDtype::kFloat;
}

at::Tensor apply_relu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                      const at::Tensor& residual) {
  const at::MemoryFormat format = x.suggest_memory_format();
  if (cuda_path(x) && (format == at::MemoryFormat::ChannelsLast ||
                       format == at::MemoryFormat::Contiguous)) {
    const at::Tensor xc = x.contiguous(format);
    const at::Tensor rc = residual.defined() ? residual.to(x.scalar_type()).contiguous(format)
                                             : at::Tensor();
    const at::Tensor s = scale.to(at::kFloat).contiguous(), b = shift.to(at::kFloat).contiguous();
    at::Tensor y = at::empty_like(xc, xc.options(), format);
    BnApplyRelu a{xc.const_data_ptr(),
                  rc.defined() ? rc.const_data_ptr() : nullptr,
                  s.const_data_ptr<float>(),
                  b.const_data_ptr<float>(),
                  y.mutable_data_ptr(),
                  xc.numel(),
                  xc.size(1),
                  xc.size(2) * xc.size(3),
                  format == at::MemoryFormat::ChannelsLast,
                  kernel_dtype(x.scalar_type())};
    launch_bn_apply_relu(a, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    return y;
  }
  at::Tensor t = x.to(compute_type(x)) * per_channel(scale) + per_channel(shift);
  if (residual.defined()) t = t + residual.to(t.scalar_type());
  return at::relu(t).to(x.scalar_type()).contiguous(format);
}

class BatchNormRelu : public torch::autograd::Function<BatchNormRelu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& residual_or_empty,
                            torch::nn::BatchNorm2dImpl* bn, double momentum, double eps) {
    const int64_t n = x.numel() / x.size(1);
    const at::Tensor residual = residual_or_empty.numel() > 0 ? residual_or_empty : at::Tensor();
    auto [mean, invstd] = batch_stats(x, eps);
    update_running(x, mean, invstd, *bn, momentum, eps, n);
    const at::Tensor scale = weight.to(mean.scalar_type()) * invstd;
    const at::Tensor shift = bias.to(mean.scalar_type()) - mean * scale;
    at::Tensor y = apply_relu(x, scale, shift, residual);
    ctx->save_for_backward({x, weight, mean, invstd, y});
    ctx->saved_data["n"] = n;
    ctx->saved_data["residual"] = residual.defined();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                     &y = saved[4];
    const int64_t n = ctx->saved_data["n"].toInt();
    // The ReLU's mask first: the batch norm's backward sees the gradient of its output.
    const at::Tensor g =
        at::threshold_backward(grads[0], y, 0).contiguous(x.suggest_memory_format());
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1),
               need_b = ctx->needs_input_grad(2);
    at::Tensor dx, dw, db;
    if (cuda_path(x)) {
      auto [sum_dy, sum_dy_xmu, grad_w, grad_b] =
          at::batch_norm_backward_reduce(g, x, mean, invstd, weight, need_x, need_w, need_b);
      if (need_x)
        dx = at::batch_norm_backward_elemt(
            g, x, mean, invstd, weight, sum_dy, sum_dy_xmu,
            at::full({1}, n, at::TensorOptions().dtype(at::kInt).device(x.device())));
      dw = grad_w;
      db = grad_b;
    } else {
      const at::Tensor gf = g.to(mean.scalar_type());
      const at::Tensor xmu = x.to(mean.scalar_type()) - per_channel(mean);
      const at::Tensor sum_dy = gf.sum({0, 2, 3}), sum_dy_xmu = (gf * xmu).sum({0, 2, 3});
      if (need_x) {
        const double inv_n = 1.0 / static_cast<double>(n);
        dx = ((gf - per_channel(sum_dy * inv_n) -
               xmu * per_channel(invstd.square() * sum_dy_xmu * inv_n)) *
              per_channel(weight.to(mean.scalar_type()) * invstd))
                 .to(x.scalar_type());
      }
      if (need_w) dw = (sum_dy_xmu * invstd).to(weight.scalar_type());
      if (need_b) db = sum_dy.to(weight.scalar_type());
    }
    const at::Tensor dres = ctx->saved_data["residual"].toBool() ? g : at::Tensor();
    return {dx, dw, db, dres, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor batch_norm_relu(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                           const at::Tensor& residual) {
  TANDEM_CHECK_ARG(bn.options.affine() && bn.options.track_running_stats() &&
                       bn.options.momentum().has_value(),
                   "batch_norm_relu needs a batch norm with an affine map, running statistics "
                   "and a momentum");
  TANDEM_CHECK_ARG(x.dim() == 4 && x.size(1) == bn.options.num_features(),
                   "batch_norm_relu: expected (N, ", bn.options.num_features(), ", H, W), got ",
                   x.sizes());
  TANDEM_CHECK_ARG(x.numel() > x.size(1),
                   "batch_norm_relu: a batch of one value per channel has no variance");
  TANDEM_CHECK_ARG(!residual.defined() || residual.sizes() == x.sizes(),
                   "batch_norm_relu: the residual is ", residual.sizes(), ", expected ",
                   x.sizes());
  // An autograd function's tensor arguments must be defined: no residual is an empty tensor.
  return BatchNormRelu::apply(x, bn.weight, bn.bias,
                              residual.defined() ? residual : at::empty({0}, x.options()), &bn,
                              *bn.options.momentum(), bn.options.eps());
}

}  // namespace tandem::models
