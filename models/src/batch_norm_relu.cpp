// batch_norm_relu: the autograd op over LibTorch's batch-norm statistics and backward kernels and
// tandem's fused apply kernel (kernels/bn_relu.cu); the CPU twin in ATen ops. See
// batch_norm_relu.h.
#include "tandem/models/batch_norm_relu.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <tuple>

#include "kernel_tensors.h"
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

std::tuple<at::Tensor, at::Tensor> batch_stats(const at::Tensor& x, double eps) {
  if (kernel_dtype_on_cuda(x))
    return at::batch_norm_stats(x, eps);  // float32 mean and 1/sqrt(var + eps)
  const at::Tensor xf = x.to(compute_type(x));
  const at::Tensor mean = xf.mean({0, 2, 3});
  const at::Tensor var = (xf - per_channel(mean)).square().mean({0, 2, 3});
  return {mean, (var + eps).rsqrt()};
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased variance.
void update_running(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& invstd,
                    torch::nn::BatchNorm2dImpl& bn, double momentum, double eps, int64_t n) {
  at::NoGradGuard no_grad;
  if (kernel_dtype_on_cuda(x)) {
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

bool float32_vector(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// The channels-last kernels of bn_relu.cu (statistics, apply with the ReLU's mask, backward):
// a CUDA x in channels-last order with whole 16-byte vectors per row, and float32 parameters
// and statistics (BatchNorm2d's own, kept float32 under autocast).
bool rows_path(const at::Tensor& x, const torch::nn::BatchNorm2dImpl& bn) {
  return channels_last_vectors(x) && float32_vector(bn.weight) && float32_vector(bn.bias) &&
         float32_vector(bn.running_mean) && float32_vector(bn.running_var) &&
         bn.num_batches_tracked.scalar_type() == at::kLong;
}

BnRows rows_of(const at::Tensor& x) {
  return BnRows{x.const_data_ptr(), x.numel() / x.size(1), x.size(1),
                kernel_dtype(x.scalar_type())};
}

BnApplyRelu apply_args(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& scale,
                       const at::Tensor& shift, const at::Tensor& y, bool relu,
                       at::MemoryFormat format) {
  return BnApplyRelu{x.const_data_ptr(),
                     residual.defined() ? residual.const_data_ptr() : nullptr,
                     scale.const_data_ptr<float>(),
                     shift.const_data_ptr<float>(),
                     y.mutable_data_ptr(),
                     x.numel(),
                     x.size(1),
                     x.size(2) * x.size(3),
                     format == at::MemoryFormat::ChannelsLast,
                     kernel_dtype(x.scalar_type()),
                     relu};
}

at::Tensor apply_relu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                      const at::Tensor& residual, bool relu) {
  const at::MemoryFormat format = x.suggest_memory_format();
  if (kernel_dtype_on_cuda(x) &&
      (format == at::MemoryFormat::ChannelsLast || format == at::MemoryFormat::Contiguous)) {
    const at::Tensor xc = x.contiguous(format);
    const at::Tensor rc =
        residual.defined() ? residual.to(x.scalar_type()).contiguous(format) : at::Tensor();
    const at::Tensor s = scale.to(at::kFloat).contiguous(), b = shift.to(at::kFloat).contiguous();
    at::Tensor y = at::empty_like(xc, xc.options(), format);
    launch_bn_apply_relu(apply_args(xc, rc, s, b, y, relu, format), stream_of(x));
    return y;
  }
  at::Tensor t = x.to(compute_type(x)) * per_channel(scale) + per_channel(shift);
  if (residual.defined()) t = t + residual.to(t.scalar_type());
  if (relu) t = at::relu(t);
  return t.to(x.scalar_type()).contiguous(format);
}

// The forward on the channels-last kernels: statistics and running statistics (two small
// kernels), then the apply writing y and, under a ReLU, its mask. Returns y, mean, invstd, mask.
// `sums` (may be undefined): x's Σx and Σx² per channel, given (conv2d_with_stats): the
// statistics' pass over x is skipped.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rows_forward(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& sums,
    torch::nn::BatchNorm2dImpl& bn, double momentum, double eps, bool relu) {
  const BnRows rows = rows_of(x);
  const int splits = bn_row_splits(rows);
  const at::TensorOptions floats = x.options().dtype(at::kFloat);
  const at::Tensor partials =
      sums.defined() ? at::Tensor() : at::empty({bn_partials_floats(rows, splits)}, floats);
  const at::Tensor stats = at::empty({4, x.size(1)}, floats);  // mean, invstd, scale, shift
  const cudaStream_t stream = stream_of(x);
  BnStats s{rows,
            splits,
            sums.defined() ? nullptr : partials.mutable_data_ptr<float>(),
            bn.weight.const_data_ptr<float>(),
            bn.bias.const_data_ptr<float>(),
            bn.running_mean.mutable_data_ptr<float>(),
            bn.running_var.mutable_data_ptr<float>(),
            bn.num_batches_tracked.mutable_data_ptr<int64_t>(),
            static_cast<float>(momentum),
            static_cast<float>(eps),
            stats[0].mutable_data_ptr<float>(),
            stats[1].mutable_data_ptr<float>(),
            stats[2].mutable_data_ptr<float>(),
            stats[3].mutable_data_ptr<float>(),
            sums.defined() ? sums.const_data_ptr<float>() : nullptr};
  launch_bn_stats(s, stream);
  const at::Tensor rc =
      residual.defined() ? residual.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast)
                         : at::Tensor();
  at::Tensor y = at::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
  BnApplyRelu a = apply_args(x, rc, stats[2], stats[3], y, relu, at::MemoryFormat::ChannelsLast);
  at::Tensor mask;
  if (relu && bn_apply_vectorized(a)) {
    mask = at::empty({x.numel() / bn_vector_width(rows.dtype)}, x.options().dtype(at::kByte));
    a.mask = mask.mutable_data_ptr<uint8_t>();
  }
  launch_bn_apply_relu(a, stream);
  return {y, stats[0], stats[1], mask};
}

// The backward on the channels-last kernels. `mask` undefined: no ReLU.
// `grad_y2` (may be undefined): the gradient of y's second use (batch_norm_relu_twice), summed
// with grad_y in the sums' pass.
variable_list rows_backward(const at::Tensor& grad_y, const at::Tensor& grad_y2,
                            const at::Tensor& x, const at::Tensor& mask, const at::Tensor& weight,
                            const at::Tensor& mean, const at::Tensor& invstd, bool need_x,
                            bool need_w, bool need_b, bool need_residual) {
  const at::Tensor g = grad_y.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor g2 = grad_y2.defined()
                            ? grad_y2.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast)
                            : at::Tensor();
  const at::Tensor g_sum =
      g2.defined() ? at::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast) : at::Tensor();
  const BnRows rows = rows_of(x);
  const int splits = bn_row_splits(rows);
  const at::TensorOptions floats = x.options().dtype(at::kFloat);
  const at::Tensor partials = at::empty({bn_partials_floats(rows, splits)}, floats);
  const at::Tensor coefficients = at::empty({3 * x.size(1)}, floats);
  at::Tensor dx =
      need_x ? at::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast) : at::Tensor();
  // With two gradients the sums' pass writes their masked sum: the residual's gradient itself.
  at::Tensor dres;
  if (need_residual)
    dres = g_sum.defined() ? g_sum : at::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
  at::Tensor dw = need_w ? at::empty_like(weight) : at::Tensor();
  at::Tensor db = need_b ? at::empty_like(weight) : at::Tensor();
  BnBackward b{rows,
               g.const_data_ptr(),
               mask.defined() ? mask.const_data_ptr<uint8_t>() : nullptr,
               mean.const_data_ptr<float>(),
               invstd.const_data_ptr<float>(),
               weight.const_data_ptr<float>(),
               splits,
               partials.mutable_data_ptr<float>(),
               coefficients.mutable_data_ptr<float>(),
               need_w ? dw.mutable_data_ptr<float>() : nullptr,
               need_b ? db.mutable_data_ptr<float>() : nullptr,
               need_x ? dx.mutable_data_ptr() : nullptr,
               need_residual && !g_sum.defined() ? dres.mutable_data_ptr() : nullptr};
  if (g2.defined()) {
    b.grad2 = g2.const_data_ptr();
    b.grad_sum = g_sum.mutable_data_ptr();
  }
  launch_bn_backward(b, stream_of(x));
  return {dx, dw, db, dres};
}

// y, or with `twice` y and a view of it (one storage): a value used twice whose two gradients
// reach the backward apart (batch_norm_relu_twice).
variable_list outputs(const at::Tensor& y, bool twice) {
  if (!twice) return {y};
  return {y, y.view_as(y)};
}

class BatchNormRelu : public torch::autograd::Function<BatchNormRelu> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const at::Tensor& residual_or_empty,
                               const at::Tensor& sums_or_empty, torch::nn::BatchNorm2dImpl* bn,
                               double momentum, double eps, bool relu, bool twice) {
    const int64_t n = x.numel() / x.size(1);
    const at::Tensor residual = residual_or_empty.numel() > 0 ? residual_or_empty : at::Tensor();
    const at::Tensor sums = sums_or_empty.numel() > 0 ? sums_or_empty : at::Tensor();
    ctx->saved_data["n"] = n;
    ctx->saved_data["residual"] = residual.defined();
    if (rows_path(x, *bn)) {
      auto [y, mean, invstd, mask] = rows_forward(x, residual, sums, *bn, momentum, eps, relu);
      // With a mask the backward needs neither y nor a pass over it; without one (no ReLU, or
      // rows the apply could not vectorize) y is the mask.
      ctx->save_for_backward(
          {x, weight, mean, invstd, relu && !mask.defined() ? y : at::Tensor(), mask});
      ctx->saved_data["rows"] = true;
      return outputs(y, twice);
    }
    auto [mean, invstd] = batch_stats(x, eps);
    update_running(x, mean, invstd, *bn, momentum, eps, n);
    const at::Tensor scale = weight.to(mean.scalar_type()) * invstd;
    const at::Tensor shift = bias.to(mean.scalar_type()) - mean * scale;
    at::Tensor y = apply_relu(x, scale, shift, residual, relu);
    ctx->save_for_backward({x, weight, mean, invstd, relu ? y : at::Tensor(), at::Tensor()});
    ctx->saved_data["rows"] = false;
    return outputs(y, twice);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // y's two uses (twice): their gradients, either of which may be undefined (a use that led
    // nowhere); summed in the channels-last sums' pass, else here.
    at::Tensor second = grads.size() > 1 ? grads[1] : at::Tensor();
    if (!grads[0].defined()) std::swap(grads[0], second);
    if (!grads[0].defined()) return variable_list(10);  // neither use reached the loss
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                     &y = saved[4], &mask = saved[5];
    const int64_t n = ctx->saved_data["n"].toInt();
    const bool residual = ctx->saved_data["residual"].toBool();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1),
               need_b = ctx->needs_input_grad(2);
    const at::Tensor none;
    if (ctx->saved_data["rows"].toBool() && !y.defined()) {
      variable_list g = rows_backward(grads[0], second, x, mask, weight, mean, invstd, need_x,
                                      need_w, need_b, residual && ctx->needs_input_grad(3));
      return {g[0], g[1], g[2], g[3], none, none, none, none, none, none};
    }
    if (second.defined()) grads[0] = grads[0] + second;
    // The ReLU's mask first: the batch norm's backward sees the gradient of its output.
    const at::Tensor g = (y.defined() ? at::threshold_backward(grads[0], y, 0) : grads[0])
                             .contiguous(x.suggest_memory_format());
    if (ctx->saved_data["rows"].toBool()) {  // y as the mask: the masked gradient, no ReLU left
      variable_list r = rows_backward(g, at::Tensor(), x, at::Tensor(), weight, mean, invstd,
                                      need_x, need_w, need_b, false);
      return {r[0], r[1], r[2], residual ? g : none, none, none, none, none, none, none};
    }
    at::Tensor dx, dw, db;
    if (kernel_dtype_on_cuda(x)) {
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
    return {dx, dw, db, residual ? g : none, none, none, none, none, none, none};
  }
};

// The arguments every form checks: bn's affine map and running statistics (and, for batch
// statistics, a momentum and a batch with a variance), x's shape, the residual's.
void check_arguments(const at::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                     const at::Tensor& residual, bool batch_statistics, const char* what,
                     const at::Tensor& sums = at::Tensor()) {
  TANDEM_CHECK_ARG(
      bn.options.affine() && bn.options.track_running_stats() &&
          (!batch_statistics || bn.options.momentum().has_value()),
      what, " needs a batch norm with an affine map",
      batch_statistics ? ", running statistics and a momentum" : " and running statistics");
  TANDEM_CHECK_ARG(x.dim() == 4 && x.size(1) == bn.options.num_features(), what, ": expected (N, ",
                   bn.options.num_features(), ", H, W), got ", x.sizes());
  TANDEM_CHECK_ARG(!batch_statistics || x.numel() > x.size(1), what,
                   ": a batch of one value per channel has no variance");
  TANDEM_CHECK_ARG(!residual.defined() || residual.sizes() == x.sizes(), what, ": the residual is ",
                   residual.sizes(), ", expected ", x.sizes());
  TANDEM_CHECK_ARG(
      !sums.defined() ||
          (sums.dim() == 2 && sums.size(0) == 2 && sums.size(1) == x.size(1) &&
           sums.scalar_type() == at::kFloat && sums.is_contiguous() && sums.device() == x.device()),
      what, ": the sums must be (2, ", x.size(1), ") float32 on ", x.device(), ", got ",
      sums.sizes(), " ", sums.scalar_type(), " on ", sums.device());
}

variable_list run(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn, const at::Tensor& residual,
                  const at::Tensor& sums, bool relu, bool twice, const char* what) {
  check_arguments(x, bn, residual, true, what, sums);
  // An autograd function's tensor arguments must be defined: no residual (no sums) is an empty
  // tensor.
  return BatchNormRelu::apply(x, bn.weight, bn.bias,
                              residual.defined() ? residual : at::empty({0}, x.options()),
                              sums.defined() ? sums : at::empty({0}, x.options()), &bn,
                              *bn.options.momentum(), bn.options.eps(), relu, twice);
}

}  // namespace

at::Tensor batch_norm_relu(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                           const at::Tensor& residual, const at::Tensor& sums) {
  return run(x, bn, residual, sums, true, false, "batch_norm_relu")[0];
}

std::pair<at::Tensor, at::Tensor> batch_norm_relu_twice(const at::Tensor& x,
                                                        torch::nn::BatchNorm2dImpl& bn,
                                                        const at::Tensor& residual,
                                                        const at::Tensor& sums) {
  variable_list y = run(x, bn, residual, sums, true, true, "batch_norm_relu_twice");
  return {y[0], y[1]};
}

at::Tensor batch_norm_train(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                            const at::Tensor& sums) {
  return run(x, bn, at::Tensor(), sums, false, false, "batch_norm_train")[0];
}

at::Tensor batch_norm_relu_eval(const at::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                                const at::Tensor& residual, bool relu) {
  check_arguments(x, bn, residual, false, "batch_norm_relu_eval");
  TANDEM_CHECK_ARG(!(at::GradMode::is_enabled() &&
                     (x.requires_grad() || (residual.defined() && residual.requires_grad()))),
                   "batch_norm_relu_eval is not differentiable: call it without gradients "
                   "(at::NoGradGuard), or use BatchNorm2d's eval-mode forward");
  at::NoGradGuard no_grad;  // scale and shift: the parameters' gradients are not wanted here
  const at::ScalarType t = compute_type(x);
  const at::Tensor scale = bn.weight.to(t) * (bn.running_var.to(t) + bn.options.eps()).rsqrt();
  const at::Tensor shift = bn.bias.to(t) - bn.running_mean.to(t) * scale;
  return apply_relu(x, scale, shift, residual, relu);
}

}  // namespace tandem::models
