// A training step's common kernels loaded ahead, on the calling thread: what prebuild_plans runs
// beside the plans it builds (kernel_warmup.cpp says why).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>

namespace tandem::models::detail {

/// Runs, on tiny operands of `dtype` (NHWC where `channels_last`) on a stream of its own on
/// `device`, the ops a convolutional classifier's training step launches besides its
/// convolutions: batch norm in training and its backward, ReLU, the residual add, max and mean
/// pooling, a linear layer (cuBLAS), cross-entropy, a momentum SGD's foreach updates. It reads
/// and writes only its own tensors and draws no random numbers; it waits for its work. Returns
/// the ops it ran (0 where it stopped on an error: what it did load stays loaded).
int64_t warm_step_kernels(int device, c10::ScalarType dtype, bool channels_last);

/// The ops warm_step_kernels runs, on the current stream of the device `on` names (any device:
/// the CPU's run checks the sequence itself); throws where an op does. Returns the ops run.
int64_t run_step_ops(const c10::TensorOptions& on, c10::ScalarType dtype, bool channels_last);

}  // namespace tandem::models::detail
