// GatheredGrad (gathered_grad.h): the wrapped layer's forward, and under data parallel a
// backward that forms the weight and bias gradients of every rank's batch from the ranks'
// gathered inputs and output gradients.
#include "tandem/gathered_grad.h"

#include <ATen/Context.h>
#include <ATen/ops/_convolution.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/conv_transpose2d.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/linear.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "tandem/detail/gradient_sync.h"

namespace tandem {

namespace {

using Kind = GatheredGradImpl::Kind;

// The mark GradientBuckets looks for (averages_its_own_gradient): a hook that does nothing.
struct AveragedByItsLayer : torch::autograd::PostAccumulateGradHook {
  void operator()(const torch::autograd::Variable&) override {}
};

at::Tensor layer_forward(Kind kind, int64_t k, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& b) {
  // The calls the modules' own forward() make, for these options (checked in adopt()).
  switch (kind) {
    case Kind::kLinear:
      return at::linear(x, w, b);
    case Kind::kConv:
      return at::conv2d(x, w, b, {k, k});
    case Kind::kConvTranspose:
      return at::conv_transpose2d(x, w, b, {k, k});
  }
  return {};
}

// The layer's own input gradient: the kernels autograd would run for this rank's batch.
at::Tensor input_grad(Kind kind, int64_t k, const at::Tensor& gy, const at::Tensor& x,
                      const at::Tensor& w) {
  if (kind == Kind::kLinear) return gy.matmul(w);
  return std::get<0>(at::convolution_backward(gy, x, w, std::nullopt, {k, k}, {0, 0}, {1, 1},
                                              kind == Kind::kConvTranspose, {0, 0}, 1,
                                              {true, false, false}));
}

// a^T b for a (N, P), b (N, Q). On CUDA as a 1x1 convolution through cuDNN, so that it follows
// cuDNN's TF32 setting, as the conv layer's own weight gradient does (at::mm would follow
// cuBLAS's, off by default: full FP32, several times slower on the 4096-channel layers); no
// autotuning and a deterministic algorithm, so every rank picks the same and gets the same bits.
at::Tensor gemm_tn_conv(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_cuda()) return a.t().mm(b);
  const int64_t n = a.size(0), p = a.size(1), q = b.size(1);
  const at::Tensor weight = a.t().contiguous().view({p, n, 1, 1});  // out channel p, in n
  const at::Tensor input = b.contiguous().view({1, n, q, 1});       // in channel n, q pixels
  const at::Context& ctx = at::globalContext();
  return at::_convolution(input, weight, std::nullopt, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1,
                          /*benchmark=*/false, /*deterministic=*/true, ctx.userEnabledCuDNN(),
                          ctx.allowTF32CuDNN(at::Float32Op::CONV))
      .view({p, q});
}

// dW and db of the gathered batch as one GEMM each: rows of (input features, output gradient)
// pairs. A patch conv (kernel == stride) is a Linear per output pixel over its patch; a patch
// transposed conv a Linear per input pixel onto its patch.
std::pair<at::Tensor, at::Tensor> weight_grads(Kind kind, int64_t k, const at::Tensor& x,
                                               const at::Tensor& gy, const at::Tensor& w,
                                               bool want_bias) {
  at::Tensor dw, db;
  switch (kind) {
    case Kind::kLinear: {
      const at::Tensor xr = x.reshape({-1, x.size(-1)}), gr = gy.reshape({-1, gy.size(-1)});
      dw = gr.t().mm(xr);  // (out, in)
      if (want_bias) db = gr.sum(0);
      break;
    }
    case Kind::kConv: {  // x (N, C, H, W), gy (N, O, Ho, Wo), w (O, C, k, k)
      const int64_t n = x.size(0), c = x.size(1), ho = gy.size(2), wo = gy.size(3);
      const at::Tensor patches = x.narrow(2, 0, ho * k)
                                     .narrow(3, 0, wo * k)
                                     .reshape({n, c, ho, k, wo, k})
                                     .permute({0, 2, 4, 1, 3, 5})
                                     .reshape({n * ho * wo, c * k * k});
      const at::Tensor gr = gy.permute({0, 2, 3, 1}).reshape({n * ho * wo, gy.size(1)});
      dw = gemm_tn_conv(gr, patches).view(w.sizes());
      if (want_bias) db = gr.sum(0);
      break;
    }
    case Kind::kConvTranspose: {  // x (N, C, H, W), gy (N, O, H*k, W*k), w (C, O, k, k)
      const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), o = gy.size(1);
      const at::Tensor xr = x.permute({0, 2, 3, 1}).reshape({n * h * wd, c});
      const at::Tensor gr = gy.reshape({n, o, h, k, wd, k})
                                .permute({0, 2, 4, 1, 3, 5})
                                .reshape({n * h * wd, o * k * k});
      dw = gemm_tn_conv(xr, gr).view(w.sizes());
      if (want_bias) db = gr.view({n * h * wd, o, k * k}).sum(at::IntArrayRef{0, 2});
      break;
    }
  }
  return {dw, db};
}

struct GatheredGradFunction : torch::autograd::Function<GatheredGradFunction> {
  // The bias as an optional: autograd takes no undefined tensor as an input.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const std::optional<at::Tensor>& bias,
                            int64_t kind, int64_t k, GradientSync* sync) {
    const at::Tensor b = bias.value_or(at::Tensor());
    ctx->save_for_backward({x, w});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["k"] = k;
    ctx->saved_data["bias"] = b.defined();
    // The sync outlives every step it is current for (the train stage owns it).
    ctx->saved_data["sync"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(sync));
    return layer_forward(static_cast<Kind>(kind), k, x, w, b);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[1];
    // In the weight's dtype: under autocast the forward ran in a lower precision, and its
    // output gradient arrives in it, while the input was saved as it came.
    const at::Tensor x = saved[0].to(w.scalar_type());
    const auto kind = static_cast<Kind>(ctx->saved_data["kind"].toInt());
    const int64_t k = ctx->saved_data["k"].toInt();
    auto* sync =
        reinterpret_cast<GradientSync*>(static_cast<intptr_t>(ctx->saved_data["sync"].toInt()));
    const at::Tensor gy = grads[0].to(w.scalar_type()).contiguous();
    at::Tensor gx, dw, db;
    if (ctx->needs_input_grad(0)) gx = input_grad(kind, k, gy, x, w).to(saved[0].scalar_type());
    const auto all = sync->all_gather_batch({x, gy});
    const bool want_bias = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    std::tie(dw, db) = weight_grads(kind, k, all[0], all[1], w, want_bias);
    // The mean over the ranks, as the all-reduce gives: each rank's loss is its batch's mean.
    const double inv_world = 1.0 / sync->world_size();
    dw.mul_(inv_world);
    if (db.defined()) db.mul_(inv_world);
    return {gx,           ctx->needs_input_grad(1) ? dw : at::Tensor(),
            db,           at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

template <typename Options>
void check_patch_conv(const Options& o, const char* what) {
  const auto& kernel = *o.kernel_size();
  const auto& stride = *o.stride();
  const auto& dilation = *o.dilation();
  const bool zero_padding = std::holds_alternative<torch::ExpandingArray<2>>(o.padding()) &&
                            (*std::get<torch::ExpandingArray<2>>(o.padding()))[0] == 0 &&
                            (*std::get<torch::ExpandingArray<2>>(o.padding()))[1] == 0;
  TANDEM_CHECK_ARG(kernel[0] == kernel[1] && stride[0] == kernel[0] && stride[1] == kernel[1] &&
                       dilation[0] == 1 && dilation[1] == 1 && o.groups() == 1 && zero_padding,
                   "GatheredGrad: a ", what, " with kernel ", at::IntArrayRef(kernel), ", stride ",
                   at::IntArrayRef(stride), ", dilation ", at::IntArrayRef(dilation), ", groups ",
                   o.groups(),
                   ": expected a square kernel equal to its stride, no padding, dilation 1, "
                   "groups 1 (patches that do not overlap)");
}

}  // namespace

GatheredGradImpl::GatheredGradImpl(torch::nn::Linear layer) {
  adopt(layer.ptr(), Kind::kLinear, 1);
}

GatheredGradImpl::GatheredGradImpl(torch::nn::Conv2d layer) {
  const auto& o = layer->options;
  check_patch_conv(o, "Conv2d");
  TANDEM_CHECK_ARG(std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()),
                   "GatheredGrad: a Conv2d with a padding mode other than zeros: expected zeros");
  adopt(layer.ptr(), Kind::kConv, (*o.kernel_size())[0]);
}

GatheredGradImpl::GatheredGradImpl(torch::nn::ConvTranspose2d layer) {
  const auto& o = layer->options;
  check_patch_conv(o, "ConvTranspose2d");
  TANDEM_CHECK_ARG((*o.output_padding())[0] == 0 && (*o.output_padding())[1] == 0,
                   "GatheredGrad: a ConvTranspose2d with output padding ",
                   at::IntArrayRef(*o.output_padding()), ": expected none");
  adopt(layer.ptr(), Kind::kConvTranspose, (*o.kernel_size())[0]);
}

template <typename LayerImpl>
void GatheredGradImpl::adopt(const std::shared_ptr<LayerImpl>& layer, Kind kind, int64_t kernel) {
  kind_ = kind;
  kernel_ = kernel;
  layer_ = layer;
  layer_forward_ = [layer](const at::Tensor& x) { return layer->forward(x); };
  // The layer's own tensors under its own names: moving this module (to()) moves the layer's.
  auto named = layer->named_parameters(/*recurse=*/false);
  const at::Tensor& w = named["weight"];
  weight = register_parameter("weight", w, w.requires_grad());
  if (const at::Tensor* b = named.find("bias"); b != nullptr && b->defined())
    bias = register_parameter("bias", *b, b->requires_grad());
  for (at::Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    TANDEM_CHECK_ARG(!torch::autograd::impl::post_acc_grad_hooks(*p),
                     "GatheredGrad: the layer's parameter of shape ", p->sizes(),
                     " already has a post-accumulate-grad hook: expected none");
    mark_averaged_by_its_layer(*p);
  }
}

void GatheredGradImpl::mark_averaged_by_its_layer(const at::Tensor& parameter) {
  torch::autograd::impl::set_post_acc_grad_hooks(parameter, std::make_unique<AveragedByItsLayer>());
}

bool GatheredGradImpl::averages_its_own_gradient(const at::Tensor& parameter) {
  const auto& hook = torch::autograd::impl::post_acc_grad_hooks(parameter);
  return dynamic_cast<const AveragedByItsLayer*>(hook.get()) != nullptr;
}

at::Tensor GatheredGradImpl::forward(const at::Tensor& input) {
  GradientSync* sync = GradientSync::current();
  const bool gathered = sync != nullptr && sync->world_size() > 1 &&
                        sync->gathers_layer_batches() && at::GradMode::is_enabled() &&
                        weight.requires_grad();
  if (!gathered) return layer_forward_(input);
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return GatheredGradFunction::apply(input, weight, b, static_cast<int64_t>(kind_), kernel_, sync);
}

void GatheredGradImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::GatheredGrad(";
  layer_->pretty_print(stream);
  stream << ")";
}

}  // namespace tandem
