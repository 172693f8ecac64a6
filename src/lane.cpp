// Lanes (named streams), the device choice, and the CUDA error helper they all use.
#include "tandem/detail/lane.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define TANDEM_HAVE_NVTX 1
#endif

#include "tandem/error.h"

namespace tandem {

namespace detail {
void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  throw CudaError(concat(expr, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(code)),
                         " (", file, ":", line, ")"));
}
}  // namespace detail

c10::Device default_device() {
  return c10::cuda::device_count() > 0 ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

c10::Device parse_device(const std::string& text) {
  if (text == "auto") return default_device();
  if (text == "cpu") return c10::Device(c10::kCPU);
  if (text.rfind("cuda", 0) == 0) {
    int64_t index = 0;
    if (text.size() > 4) {
      TANDEM_CHECK_ARG(text[4] == ':' && text.size() > 5 &&
                           text.find_first_not_of("0123456789", 5) == std::string::npos,
                       "device '", text, "' is not valid: expected auto, cpu, cuda or cuda:N");
      // Saturating, where std::stoi would throw std::out_of_range on "cuda:99999999999".
      for (size_t i = 5; i < text.size() && index <= 1000000; ++i)
        index = 10 * index + (text[i] - '0');
    }
    const int count = c10::cuda::device_count();
    TANDEM_CHECK_ARG(index < count, "device '", text, "' is not available: this machine has ",
                     count, " CUDA device(s)");
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw InvalidArgument(
      detail::concat("device '", text, "' is not valid: expected auto, cpu, cuda or cuda:N"));
}

Lane Lane::create(std::string name, c10::Device device, LanePriority priority) {
  if (!device.is_cuda()) return Lane(std::move(name), device, std::nullopt);
  return Lane(std::move(name), device,
              c10::cuda::getStreamFromPool(priority == LanePriority::kHigh, device.index()));
}

Lane Lane::current(std::string name, c10::Device device) {
  if (!device.is_cuda()) return Lane(std::move(name), device, std::nullopt);
  return Lane(std::move(name), device, c10::cuda::getCurrentCUDAStream(device.index()));
}

c10::cuda::CUDAStream Lane::stream() const {
  TORCH_CHECK(stream_.has_value(), "lane '", name_, "' is a CPU lane and has no CUDA stream");
  return *stream_;
}

bool Lane::same_stream(const Lane& other) const {
  if (!is_cuda() || !other.is_cuda()) return !is_cuda() && !other.is_cuda();
  return *stream_ == *other.stream_;
}

void Lane::wait_for(const Lane& other) const {
  if (!is_cuda() || !other.is_cuda() || same_stream(other)) return;
  at::cuda::CUDAEvent event;
  event.record(*other.stream_);
  event.block(*stream_);
}

void Lane::synchronize() const {
  if (is_cuda()) stream_->synchronize();
}

LaneGuard::LaneGuard(const Lane& lane, const char* what) {
  if (lane.is_cuda()) guard_.emplace(lane.stream());
#ifdef TANDEM_HAVE_NVTX
  const std::string label = what ? lane.name() + "/" + what : lane.name();
  nvtxRangePushA(label.c_str());
#endif
}

LaneGuard::~LaneGuard() {
#ifdef TANDEM_HAVE_NVTX
  nvtxRangePop();
#endif
}

}  // namespace tandem
