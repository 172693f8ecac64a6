// LossLog: checks a recorded loss, appends it (a kernel on CUDA, a store on the CPU) and reads
// the log back in one copy.
#include "loss_log.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>

#include "kernels/loss_log_launch.h"
#include "tandem/error.h"

namespace tandem {

namespace {
constexpr int64_t kCursorBytes = sizeof(int64_t);
}  // namespace

LossLog::LossLog(int64_t capacity, c10::Device device) : capacity_(capacity), device_(device) {
  TANDEM_CHECK_ARG(capacity >= 0, "loss log capacity ", capacity,
                   " is not valid: expected a number of entries >= 0");
  buffer_ = at::zeros({kCursorBytes + capacity * static_cast<int64_t>(sizeof(float))},
                      at::TensorOptions().dtype(at::kByte).device(device));
  device_ = buffer_.device();  // "cuda" becomes "cuda:N"
  cursor_ = buffer_.narrow(0, 0, kCursorBytes).view(at::kLong);
  log_ = buffer_.narrow(0, kCursorBytes, buffer_.numel() - kCursorBytes).view(at::kFloat);
}

void LossLog::record(const at::Tensor& loss) {
  TANDEM_CHECK_ARG(loss.defined() && loss.numel() == 1 && loss.scalar_type() == at::kFloat &&
                       loss.device() == device_,
                   "a loss log records one-element float32 tensors on ", device_, ", got ",
                   loss.defined() ? detail::concat("a ", loss.scalar_type(), " tensor of shape ",
                                                   loss.sizes(), " on ", loss.device())
                                  : std::string("an undefined tensor"));
  if (!device_.is_cuda()) {
    int64_t& cursor = *cursor_.mutable_data_ptr<int64_t>();
    if (cursor < capacity_) log_.mutable_data_ptr<float>()[cursor] = *loss.const_data_ptr<float>();
    ++cursor;
    return;
  }
  const c10::cuda::CUDAGuard guard(device_);
  launch_loss_log_append({loss.const_data_ptr<float>(), log_.mutable_data_ptr<float>(),
                          cursor_.mutable_data_ptr<int64_t>(), capacity_},
                         c10::cuda::getCurrentCUDAStream(device_.index()).stream());
}

void LossLog::reset() {
  if (device_.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device_);
    cursor_.zero_();
  } else {
    *cursor_.mutable_data_ptr<int64_t>() = 0;
  }
}

int64_t LossLog::records() const {
  return device_.is_cuda() ? cursor_.item<int64_t>() : *cursor_.const_data_ptr<int64_t>();
}

int64_t LossLog::overflowed() const { return std::max<int64_t>(0, records() - capacity_); }

std::vector<float> LossLog::values() const {
  const at::Tensor host = buffer_.to(at::kCPU);  // the one copy; synchronizes the stream
  const auto* bytes = host.const_data_ptr<uint8_t>();
  int64_t n = 0;
  std::memcpy(&n, bytes, kCursorBytes);
  TORCH_CHECK(n <= capacity_, "the loss log holds ", capacity_, " entries but ", n,
              " losses were recorded: the last ", n - capacity_, " were dropped");
  std::vector<float> out(static_cast<size_t>(n));
  std::memcpy(out.data(), bytes + kCursorBytes, out.size() * sizeof(float));
  return out;
}

}  // namespace tandem
