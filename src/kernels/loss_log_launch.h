// The launcher of the loss log's append kernel: plain pointers, no LibTorch types, so
// loss_log.cu compiles without LibTorch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem {

struct LossLogAppend {
  const float* loss;  // (1,) float32, device: the value to append
  float* log;         // (capacity,) float32, device
  int64_t* cursor;    // (1,) int64, device: records so far, overflowed ones included
  int64_t capacity;
};

/// One single-thread launch on `stream`: log[*cursor] = *loss if *cursor < capacity, then
/// ++*cursor. The index is read on the device when the kernel runs, so a captured launch
/// appends the next entry on every replay. Checks the launch. Capture-safe.
void launch_loss_log_append(const LossLogAppend& args, cudaStream_t stream);

}  // namespace tandem
