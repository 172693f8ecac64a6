// The launcher of the fused batch-norm apply kernel: plain pointers, no LibTorch types, so
// bn_relu.cu compiles without LibTorch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::models {

enum class BnDtype { kFloat, kBFloat16, kHalf };

struct BnApplyRelu {
  const void* x;         // (N, C, H, W) of `dtype`, contiguous in NCHW or in channels-last order
  const void* residual;  // null, or laid out and typed as x
  const float* scale;    // (C,) float32: weight * invstd
  const float* shift;    // (C,) float32: bias - mean * weight * invstd
  void* y;               // laid out and typed as x
  int64_t numel, channels, spatial;  // N*C*H*W, C, H*W
  bool channels_last;
  BnDtype dtype;
};

/// y = relu(x * scale[c] + shift[c] (+ residual)) in float32, rounded once to the dtype, on
/// `stream`. NaN stays NaN, as torch.relu. Checks the launch. Capture-safe.
void launch_bn_apply_relu(const BnApplyRelu& args, cudaStream_t stream);

}  // namespace tandem::models
