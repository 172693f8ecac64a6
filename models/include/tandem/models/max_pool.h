// A ResNet stem's max pool (3x3 window, stride 2, padding 1) as an autograd op with tandem's own
// channels-last CUDA kernels: the forward keeps one byte per output element for where its
// maximum was (LibTorch keeps eight), and the backward gathers each input's gradient from the
// at most four outputs that can have picked it, instead of scattering into a zero-filled tensor.
// The same values and gradients as torch's max_pool2d(x, 3, 2, 1), ties and NaN included (the
// tests compare them), with one deliberate difference: a window of nothing but -inf sends its
// gradient to its own first position, where torch's channels-last kernel sends it to the image's
// first pixel, outside the window. Other layouts, dtypes and devices run torch's own op.
#pragma once

#include <ATen/core/Tensor.h>

namespace tandem::models {

/// max_pool2d(x, kernel 3, stride 2, padding 1) for a 4-D x; gradients reach x.
at::Tensor max_pool_3x3_stride2(const at::Tensor& x);

}  // namespace tandem::models
