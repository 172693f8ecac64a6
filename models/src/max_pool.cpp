// max_pool_3x3_stride2: the autograd op over kernels/max_pool.cu. See max_pool.h.
#include "tandem/models/max_pool.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "kernel_tensors.h"
#include "kernels/max_pool_launch.h"
#include "tandem/error.h"

namespace tandem::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// tandem's kernels: CUDA, float / bf16 / half, channels-last, whole 16-byte vectors of channels.
bool own_kernels(const at::Tensor& x) {
  return channels_last_vectors(x) && x.size(2) >= 1 && x.size(3) >= 1;
}

MaxPoolShape shape_of(const at::Tensor& x) {
  // Output side: floor((side + 2 * 1 - 3) / 2) + 1.
  return MaxPoolShape{x.size(0),
                      x.size(2),
                      x.size(3),
                      x.size(1),
                      (x.size(2) - 1) / 2 + 1,
                      (x.size(3) - 1) / 2 + 1,
                      kernel_dtype(x.scalar_type())};
}

class MaxPool3x3 : public torch::autograd::Function<MaxPool3x3> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const MaxPoolShape s = shape_of(x);
    at::Tensor y = at::empty({s.n, s.channels, s.out_h, s.out_w},
                             x.options().memory_format(at::MemoryFormat::ChannelsLast));
    at::Tensor window =
        at::empty({s.n * s.out_h * s.out_w * s.channels}, x.options().dtype(at::kByte));
    launch_max_pool_forward(s, x.const_data_ptr(), y.mutable_data_ptr(),
                            window.mutable_data_ptr<uint8_t>(), stream_of(x));
    ctx->save_for_backward({window});
    ctx->saved_data["shape"] = std::vector<int64_t>{x.size(0), x.size(1), x.size(2), x.size(3)};
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor window = ctx->get_saved_variables()[0];
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor gy = grads[0].to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor gx = at::empty(shape, gy.options().memory_format(at::MemoryFormat::ChannelsLast));
    launch_max_pool_backward(shape_of(gx), gy.const_data_ptr(), window.const_data_ptr<uint8_t>(),
                             gx.mutable_data_ptr(), stream_of(gx));
    return {gx};
  }
};

}  // namespace

at::Tensor max_pool_3x3_stride2(const at::Tensor& x) {
  TANDEM_CHECK_ARG(x.dim() == 4, "max_pool_3x3_stride2: expected (N, C, H, W), got ", x.sizes());
  if (!own_kernels(x)) return at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  return MaxPool3x3::apply(x);
}

}  // namespace tandem::models
