// The launchers of the ResNet stem's max pool (3x3 window, stride 2, padding 1) in channels-last
// order (max_pool.cu): plain pointers, no LibTorch types.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bn_relu_launch.h"  // BnDtype, bn_vector_width

namespace tandem::models {

struct MaxPoolShape {
  int64_t n, h, w, channels;  // the input's; channels a multiple of the vector width
  int64_t out_h, out_w;
  BnDtype dtype;
};

/// y[n, oh, ow, c] = the window's maximum (NaN wins, and a later NaN over an earlier one, as
/// LibTorch's kernel), `window` its position in the 3x3 window (0..8, row-major; the first valid
/// position when every value is -inf), one byte per output element. Capture-safe.
void launch_max_pool_forward(const MaxPoolShape& s, const void* x, void* y, uint8_t* window,
                             cudaStream_t stream);

/// dL/dx: each input element sums the gradients of the (at most four) outputs whose window picked
/// it, in float32, rounded once. Every element is written: no zero fill first.
void launch_max_pool_backward(const MaxPoolShape& s, const void* grad_y, const uint8_t* window,
                              void* grad_x, cudaStream_t stream);

}  // namespace tandem::models
