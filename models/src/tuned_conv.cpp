// tuned_conv2d: the autograd op over cudnn_conv_plans.cpp's passes, LibTorch's convolution
// where they do not apply. See tuned_conv.h.
#include "tandem/models/tuned_conv.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/ConvUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cudnn_conv_graphs.h"
#include "cudnn_conv_plans.h"
#include "tandem/error.h"

namespace tandem::models {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Whether the variable says one of `words` (lower case), in any case.
bool env_says(const char* name, std::initializer_list<const char*> words) {
  std::string value = env_or_empty(name);
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* word : words)
    if (value == word) return true;
  return false;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// Whether the cuDNN passes may run these (already autocast) operands at all. Groups are what
// the channel counts say (cuDNN reads the group count off x's channels over the weight's).
bool applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t groups) {
  const auto type = x.scalar_type();
  return x.is_cuda() && x.dim() == 4 && w.dim() == 4 && groups >= 1 &&
         x.size(1) == w.size(1) * groups && w.size(0) % groups == 0 &&
         (type == at::kHalf || type == at::kBFloat16) && w.scalar_type() == type &&
         w.device() == x.device() && (!bias.defined() || bias.scalar_type() == type) &&
         at::globalContext().userEnabledCuDNN() && at::globalContext().benchmarkCuDNN() &&
         !at::globalContext().deterministicAlgorithms() && detail::cudnn_graphs_compiled();
}

// LibTorch's layout choice for a cuDNN convolution: channels-last where either operand is.
at::MemoryFormat layout_of(const at::Tensor& x, const at::Tensor& w) {
  return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                 w.suggest_memory_format() == at::MemoryFormat::ChannelsLast
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

// One pass into a new tensor of `sizes` in `layout`; undefined where cuDNN has no plan (the
// shape's first time said once on stderr).
at::Tensor pass(detail::ConvPass which, const at::Tensor& a, const at::Tensor& b,
                at::IntArrayRef sizes, at::MemoryFormat layout, const detail::ConvGeometry& geo) {
  if (!aligned(a) || !aligned(b)) return {};
  at::Tensor out = at::empty(sizes, a.options().memory_format(layout));
  std::string why;
  if (detail::cudnn_conv_pass(which, a, b, out, geo, why)) return out;
  if (!why.empty())
    std::cerr << "tuned_conv2d: cuDNN has no plan for a " << b.sizes() << " convolution pass of "
              << a.sizes() << " here (" << why << "); LibTorch's convolution runs it\n";
  return {};
}

struct Geometry {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  detail::ConvGeometry view() const { return {stride, padding, dilation}; }
};

at::Tensor forward_pass(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                        const Geometry& g) {
  const at::MemoryFormat layout = layout_of(x, w);
  const at::Tensor xc = x.contiguous(layout), wc = w.contiguous(layout);
  const std::vector<int64_t> y_sizes =
      at::native::conv_output_size(xc.sizes(), wc.sizes(), g.padding, g.stride, g.dilation);
  at::Tensor y = pass(detail::ConvPass::kForward, xc, wc, y_sizes, layout, g.view());
  if (!y.defined()) return at::conv2d(x, w, bias, g.stride, g.padding, g.dilation, g.groups);
  if (bias.defined()) y.add_(bias.reshape({1, -1, 1, 1}));  // as LibTorch adds it after cuDNN
  return y;
}

// x's and w's gradients (as asked) for the output's gradient dy: the input- and weight-gradient
// plans (unless `on_plans` is false), LibTorch's backward for what they do not run.
std::pair<at::Tensor, at::Tensor> backward_passes(const at::Tensor& dy, const at::Tensor& x,
                                                  const at::Tensor& w, const Geometry& g,
                                                  bool want_x, bool want_w, bool on_plans = true) {
  const at::MemoryFormat layout = layout_of(x, w);
  at::Tensor dx, dw;
  if (want_x && on_plans)
    dx = pass(detail::ConvPass::kInputGrad, dy, w.contiguous(layout), x.sizes(), layout, g.view());
  if (want_w && on_plans)
    dw = pass(detail::ConvPass::kWeightGrad, dy, x.contiguous(layout), w.sizes(), layout, g.view());
  const bool libtorch_x = want_x && !dx.defined(), libtorch_w = want_w && !dw.defined();
  if (libtorch_x || libtorch_w) {
    auto [ldx, ldw, unused] =
        at::convolution_backward(dy, x, w, std::nullopt, g.stride, g.padding, g.dilation, false,
                                 {0, 0}, g.groups, {libtorch_x, libtorch_w, false});
    if (libtorch_x) dx = ldx;
    if (libtorch_w) dw = ldw;
  }
  return {dx, dw};
}

class TunedConv : public torch::autograd::Function<TunedConv> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, Geometry geometry) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["stride"] = geometry.stride;
    ctx->saved_data["padding"] = geometry.padding;
    ctx->saved_data["dilation"] = geometry.dilation;
    ctx->saved_data["groups"] = geometry.groups;
    return {forward_pass(x, weight, bias.numel() > 0 ? bias : at::Tensor(), geometry)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor& dy_in = grads[0];
    if (!dy_in.defined()) return variable_list(4);
    const Geometry g{ctx->saved_data["stride"].toIntVector(),
                     ctx->saved_data["padding"].toIntVector(),
                     ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt()};
    const at::Tensor dy = dy_in.contiguous(layout_of(x, w));
    auto [dx, dw] =
        backward_passes(dy, x, w, g, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    at::Tensor db;
    if (ctx->needs_input_grad(2)) db = dy.sum({0, 2, 3});  // never the empty stand-in's
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

at::Tensor tuned_conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                        int64_t groups) {
  TANDEM_CHECK_ARG(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
                   "tuned_conv2d: expected two strides, paddings and dilations, got ", stride, ", ",
                   padding, " and ", dilation);
  // Autocast's cast as at::conv2d's would be (one of its lower-precision ops): cached for
  // weights, differentiable back to the float32 parameters. The operands cast, nothing after
  // casts again (autocast's own conv2d is these casts and then the convolution without it).
  at::Tensor xa = x, wa = weight, ba = bias;
  std::optional<c10::impl::ExcludeDispatchKeyGuard> cast;
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const at::ScalarType type = at::autocast::get_autocast_dtype(at::kCUDA);
    xa = at::autocast::cached_cast(type, x, at::kCUDA);
    wa = at::autocast::cached_cast(type, weight, at::kCUDA);
    if (bias.defined()) ba = at::autocast::cached_cast(type, bias, at::kCUDA);
    cast.emplace(c10::autocast_dispatch_keyset);
  }
  // What does not apply, mismatched channels included, is LibTorch's (and its error).
  if (!applies(xa, wa, ba, groups))
    return at::conv2d(xa, wa, ba, stride, padding, dilation, groups);
  Geometry g{stride.vec(), padding.vec(), dilation.vec(), groups};
  if (!at::GradMode::is_enabled() ||
      !(xa.requires_grad() || wa.requires_grad() || (ba.defined() && ba.requires_grad())))
    return forward_pass(xa, wa, ba, g);
  // LibTorch's C++ autograd functions take no undefined tensor (each input's device is read):
  // no bias is an empty one, which backward gives no gradient.
  return TunedConv::apply(xa, wa, ba.defined() ? ba : at::empty({0}, xa.options()),
                          std::move(g))[0];
}

std::pair<at::Tensor, at::Tensor> tuned_conv2d_backward(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        at::IntArrayRef stride,
                                                        at::IntArrayRef padding,
                                                        at::IntArrayRef dilation, int64_t groups,
                                                        bool want_x, bool want_weight) {
  TANDEM_CHECK_ARG(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
                   "tuned_conv2d_backward: expected two strides, paddings and dilations, got ",
                   stride, ", ", padding, " and ", dilation);
  const Geometry g{stride.vec(), padding.vec(), dilation.vec(), groups};
  const at::Tensor dyc = dy.contiguous(layout_of(x, weight));
  const bool on_plans =
      applies(x, weight, at::Tensor(), groups) && dyc.scalar_type() == x.scalar_type();
  return backward_passes(dyc, x, weight, g, want_x, want_weight, on_plans);
}

ConvPlansSummary conv_plans_summary() { return detail::plan_counts(); }

int64_t load_conv_plans(const std::string& path, std::string& note) {
  return detail::load_plan_choices(path, note);
}

bool save_conv_plans(const std::string& path, std::string& error) {
  return detail::save_plan_choices(path, error);
}

void clear_conv_plans() { detail::clear_plans(); }

void set_conv_plans_job(const std::string& job) { detail::set_plans_job(job); }

int64_t prebuild_conv_plans(const std::string& job, int threads) {
  return detail::prebuild_plans(job, threads,
                                env_says("TANDEM_KERNEL_WARMUP", {"1", "on", "true", "yes"}));
}

bool conv_plans_unsaved() { return detail::plans_unsaved(); }

std::string default_conv_plans_path() {
  constexpr const char* kFile = "/cudnn-plans.json";
  if (env_says("TANDEM_MODE_CACHE", {"0", "off", "false", "no"})) return "";
  const std::string folder = env_or_empty("TANDEM_MODE_CACHE");
  if (!folder.empty()) return folder + kFile;
  std::string base = env_or_empty("XDG_CACHE_HOME");
  if (base.empty()) {
    const std::string home = env_or_empty("HOME");
    if (home.empty()) return "";
    base = home + "/.cache";
  }
  return base + "/tandem/modes" + kFile;
}

KeptConvPlans::KeptConvPlans(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::string note;
  load_conv_plans(path_, note);
  if (!note.empty())
    std::cerr << "tandem: the convolution plans file was not used: " << note << "\n";
}

KeptConvPlans::~KeptConvPlans() {
  try {
    save();
  } catch (const std::exception& e) {  // a scope's end never throws
    std::cerr << "tandem: the convolution plans could not be kept: " << e.what() << "\n";
  }
}

void KeptConvPlans::save() {
  if (path_.empty() || !conv_plans_unsaved()) return;
  std::string error;
  if (!save_conv_plans(path_, error)) {
    std::cerr << "tandem: the convolution plans could not be kept: " << error << "\n";
    path_.clear();  // said once
  }
}

}  // namespace tandem::models
