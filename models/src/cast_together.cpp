// cast_together: the forward and backward casts as multi-tensor copies (_foreach_copy_, whose
// CUDA kernel converts dtypes where every pair shares sizes and strides). See cast_together.h.
#include "tandem/models/cast_together.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "tandem/detail/laid_out_like.h"

namespace tandem::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// dst[i] = src[i] (converting), one launch for the pairs the multi-tensor kernel takes (same
// sizes and strides) and a copy_ each for the rest.
void copy_together(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  std::vector<at::Tensor> fast_dst, fast_src;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].strides() == src[i].strides() && src[i].is_non_overlapping_and_dense()) {
      fast_dst.push_back(dst[i]);
      fast_src.push_back(src[i]);
    } else {
      dst[i].copy_(src[i]);
    }
  }
  if (!fast_dst.empty()) at::_foreach_copy_(fast_dst, fast_src);
}

class CastTogether : public torch::autograd::Function<CastTogether> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, at::ScalarType dtype) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    // What backward needs of each input to lay its gradient out as the input: its dtype and
    // strides (not the tensor itself: a saved input would hold it against in-place updates).
    std::vector<int64_t> dtypes, dims, strides;
    for (const at::Tensor& t : tensors) {
      out.push_back(at::empty_like(t, t.options().dtype(dtype)));
      dtypes.push_back(static_cast<int64_t>(t.scalar_type()));
      dims.push_back(t.dim());
      strides.insert(strides.end(), t.strides().begin(), t.strides().end());
    }
    copy_together(out, tensors.vec());
    // A cast of a tensor without a gradient has none either (a frozen weight's).
    variable_list frozen;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!tensors[i].requires_grad()) frozen.push_back(out[i]);
    ctx->mark_non_differentiable(frozen);
    // A cast that reached no loss gets no gradient: not a zero tensor copied back.
    ctx->set_materialize_grads(false);
    ctx->saved_data["dtypes"] = dtypes;
    ctx->saved_data["dims"] = dims;
    ctx->saved_data["strides"] = strides;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    const std::vector<int64_t> dims = ctx->saved_data["dims"].toIntVector();
    const std::vector<int64_t> strides = ctx->saved_data["strides"].toIntVector();
    variable_list result(grads.size() + 1);  // the last: dtype's, none
    std::vector<at::Tensor> dst, src;
    size_t at = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const c10::IntArrayRef own(strides.data() + at, static_cast<size_t>(dims[i]));
      at += static_cast<size_t>(dims[i]);
      if (!grads[i].defined() || !ctx->needs_input_grad(i)) continue;
      result[i] = at::empty_strided(
          grads[i].sizes(), own, grads[i].options().dtype(static_cast<at::ScalarType>(dtypes[i])));
      dst.push_back(result[i]);
      src.push_back(detail::laid_out_like(grads[i], result[i]));
    }
    copy_together(dst, src);
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> cast_together(const std::vector<at::Tensor>& tensors,
                                      at::ScalarType dtype) {
  if (tensors.empty()) return {};
  // A TensorList, not a vector: apply takes a list's tensors as the op's inputs only in that form.
  return CastTogether::apply(at::TensorList(tensors), dtype);
}

}  // namespace tandem::models
