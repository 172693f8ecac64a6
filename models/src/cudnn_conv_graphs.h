// cuDNN's fused convolution graphs (its graph API through NVIDIA's C++ frontend), behind plain
// LibTorch types: the only file that includes the frontend's heavy headers is
// cudnn_conv_graphs.cpp. Built per shape on first use, kept for the process; a shape cuDNN has
// no engine for is remembered as such, and the caller runs its unfused kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace tandem::models::detail {

/// Whether this build has cuDNN's graph API compiled in (the frontend's headers were found).
bool cudnn_graphs_compiled();

/// libcudnn.so.9 as LibTorch loaded it (the frontend's dynamic-loading mode reads cuDNN's
/// functions through it), loaded on first use; null where it cannot be (no graphs then). Only in
/// builds with the frontend.
void* cudnn_library();

/// The convolution conv2d(x, weight) (no bias, dilation 1, one group) and the per-channel sum
/// and sum of squares of its output, computed in the convolution's epilogue (cuDNN's "genstats"),
/// as one graph on the current stream with LibTorch's cuDNN handle and a workspace from its
/// caching allocator (capture-safe once the shape's graph is built). x and weight: CUDA, half,
/// channels-last; `input_nonnegative`: x is a ReLU's output, so a form with a ReLU before the
/// convolution may stand in where cuDNN has no engine for the plain one. Returns false, writing
/// nothing, where there is no such graph for this shape on this GPU (`why` then says why, the
/// first time for the shape; empty after); else y (N, K, H', W') channels-last half and sums
/// (2, K) float32: row 0 Σy, row 1 Σy² over N·H'·W'.
bool cudnn_conv_with_stats(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                           at::IntArrayRef padding, bool input_nonnegative, at::Tensor& y,
                           at::Tensor& sums, std::string& why);

}  // namespace tandem::models::detail
