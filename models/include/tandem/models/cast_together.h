// A group of weights cast to autocast's lower precision in one launch, and their gradients cast
// back in one. Autocast casts a float32 weight where an op reads it, one launch a weight, and
// its gradient back in another: 113 launches a ResNet-50 step, 0.65 ms under Nsight Compute,
// each latency-bound on a few kilobytes to megabytes. A group cast once per forward holds the
// same values (the same rounding), so the step's losses are the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tandem::models {

/// Each tensor of `tensors` in `dtype`, as at::Tensor::to would give it (same values, same
/// strides), through one multi-tensor launch where the layouts allow (a copy each otherwise).
/// Differentiable: the gradients reaching the casts come back in each tensor's own dtype and
/// layout (a size-1 dimension's stride aside), again through one launch, once every cast's
/// gradient has arrived — so a data-parallel reducer sees the group's gradients together at
/// the end of the group's backward, not one by one. Capture-safe; runs on the current stream.
std::vector<at::Tensor> cast_together(const std::vector<at::Tensor>& tensors, at::ScalarType dtype);

}  // namespace tandem::models
