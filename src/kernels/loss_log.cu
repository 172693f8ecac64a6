// The loss log's append kernel: one thread reads the device cursor, stores the loss there if the
// log has room, and advances the cursor (which keeps counting past the capacity, so overflow is
// seen by the reader instead of lost).
#include "loss_log_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {

__global__ void loss_log_append_kernel(LossLogAppend a) {
  const int64_t i = *a.cursor;
  if (i < a.capacity) a.log[i] = *a.loss;
  *a.cursor = i + 1;
}

}  // namespace

void launch_loss_log_append(const LossLogAppend& args, cudaStream_t stream) {
  loss_log_append_kernel<<<1, 1, 0, stream>>>(args);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem
