// The models layer's CUDA kernels (kernels/*.cu) seen from LibTorch's tensors: which tensors
// they take, the dtype tag and the stream their launchers get. Shared by the ops over them
// (batch_norm_relu.cpp, max_pool.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "kernels/bn_relu_launch.h"  // BnDtype, bn_vector_width

namespace tandem::models {

/// A CUDA tensor of float, bfloat16 or float16: the element types the kernels compute on (and
/// LibTorch's CUDA batch-norm primitives take, in either layout).
inline bool kernel_dtype_on_cuda(const at::Tensor& x) {
  const at::ScalarType t = x.scalar_type();
  return x.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

inline BnDtype kernel_dtype(at::ScalarType t) {
  return t == at::kBFloat16 ? BnDtype::kBFloat16
         : t == at::kHalf   ? BnDtype::kHalf
                            : BnDtype::kFloat;
}

/// A (N, C, H, W) tensor the channels-last kernels read as rows of whole 16-byte vectors:
/// kernel_dtype_on_cuda, contiguous in channels-last order, C a multiple of the vector width,
/// the data 16-byte aligned.
inline bool channels_last_vectors(const at::Tensor& x) {
  return kernel_dtype_on_cuda(x) && x.dim() == 4 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         x.size(1) % bn_vector_width(kernel_dtype(x.scalar_type())) == 0 &&
         reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
}

/// The current stream of x's device, for a launcher.
inline cudaStream_t stream_of(const at::Tensor& x) {
  return c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
}

}  // namespace tandem::models
