// NVML through dlopen: the few entry points tandem needs, declared here with NVML's C ABI.
#include "tandem/run/gpu_monitor.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

namespace tandem::run {

namespace {
// NVML's C types and constants, as its public header defines them.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotFound = 6;  // NVML_ERROR_NOT_FOUND: no sample newer than asked
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr int kNvmlGpuUtilizationSamples = 1;  // nvmlSamplingType_t
enum NvmlValueType : int { kDouble = 0, kUnsignedInt = 1 };
union NvmlValue {
  double d;
  unsigned int ui;
  unsigned long ul;
  unsigned long long ull;
  signed long long sll;
};
struct NvmlSample {
  unsigned long long timestamp_us;
  NvmlValue value;
};

uint64_t now_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

struct GpuMonitor::Nvml {
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  // Optional: without it (or where the driver keeps no samples) the reader falls back.
  NvmlReturn (*samples)(NvmlDevice, int, unsigned long long, int*, unsigned int*,
                        NvmlSample*) = nullptr;
  std::string unavailable;  // why NVML cannot be used; empty when it can
};

// NVML loaded and initialized once per library path for the whole process, never shut down: an
// nvmlInit per monitor cost every fit of a tandem.Trainer (each reports GPU utilization) tens to
// hundreds of milliseconds. Never destroyed, as the library it points into is never unloaded.
const GpuMonitor::Nvml& GpuMonitor::loaded_nvml(const std::string& library) {
  static std::mutex mutex;
  static auto* by_library = new std::map<std::string, GpuMonitor::Nvml>;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = by_library->try_emplace(library);
  GpuMonitor::Nvml& n = it->second;
  if (!inserted) return n;
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    n.unavailable = "NVML not found (" + library + ")";
    return n;
  }
  const auto init = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib, "nvmlInit_v2"));
  n.by_pci_bus_id = reinterpret_cast<NvmlReturn (*)(const char*, NvmlDevice*)>(
      dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  n.utilization = reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlUtilization*)>(
      dlsym(lib, "nvmlDeviceGetUtilizationRates"));
  n.samples =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, int, unsigned long long, int*, unsigned int*,
                                      NvmlSample*)>(dlsym(lib, "nvmlDeviceGetSamples"));
  if (!init || !n.by_pci_bus_id || !n.utilization)
    n.unavailable = "NVML lacks the functions tandem needs";
  else if (init() != kNvmlSuccess)
    n.unavailable = "nvmlInit failed";
  return n;
}

GpuMonitor::GpuMonitor(c10::Device device, std::string library, int period_ms)
    : period_ms_(period_ms) {
  if (!device.is_cuda()) {
    reason_ = "not a CUDA device";
    return;
  }
  const Nvml& nvml = loaded_nvml(library);
  if (!nvml.unavailable.empty()) {
    reason_ = nvml.unavailable;
    return;
  }
  nvml_ = &nvml;
  // CUDA and NVML number devices differently (CUDA_VISIBLE_DEVICES): match them by PCI bus id.
  char bus_id[32] = {0};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device.index()) != cudaSuccess) {
    reason_ = "no PCI bus id for " + device.str();
    return;
  }
  if (nvml_->by_pci_bus_id(bus_id, &device_handle_) != kNvmlSuccess) {
    reason_ = std::string("NVML does not know device ") + bus_id;
    return;
  }
  available_ = true;
}

GpuMonitor::~GpuMonitor() { stop(); }

void GpuMonitor::start() {
  if (!available_ || running_) return;
  running_ = true;
  stop_requested_ = false;
  sum_ = 0;
  samples_ = 0;
  last_seen_us_ = now_us();
  from_buffer_ = nvml_->samples != nullptr;
  reader_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(period_ms_),
                           [this] { return stop_requested_; }))
      collect();
  });
}

void GpuMonitor::stop() {
  if (!running_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  if (reader_.joinable()) reader_.join();
  collect();                          // what the driver sampled since the last wake-up
  if (samples_ == 0) read_current();  // a run shorter than one sample period
  running_ = false;
}

void GpuMonitor::collect() {
  if (!from_buffer_) {
    read_current();
    return;
  }
  unsigned int capacity = 0;
  int value_type = kUnsignedInt;
  NvmlReturn rc = nvml_->samples(device_handle_, kNvmlGpuUtilizationSamples, last_seen_us_,
                                 &value_type, &capacity, nullptr);
  if (rc == kNvmlSuccess && capacity > 0) {
    std::vector<NvmlSample> buffer(capacity);
    unsigned int count = capacity;
    rc = nvml_->samples(device_handle_, kNvmlGpuUtilizationSamples, last_seen_us_, &value_type,
                        &count, buffer.data());
    if (rc == kNvmlSuccess) {
      uint64_t newest = last_seen_us_;
      for (unsigned int i = 0; i < count && i < capacity; ++i) {
        const NvmlSample& s = buffer[i];
        if (s.timestamp_us <= last_seen_us_) continue;
        sum_ += value_type == kDouble ? s.value.d : static_cast<double>(s.value.ui);
        ++samples_;
        newest = std::max<uint64_t>(newest, s.timestamp_us);
      }
      last_seen_us_ = newest;
      return;
    }
  }
  if (rc == kNvmlNotFound || (rc == kNvmlSuccess && capacity == 0)) return;  // nothing new yet
  from_buffer_ = false;  // the driver keeps no samples here: read the current figure instead
  read_current();
}

void GpuMonitor::read_current() {
  NvmlUtilization u{};
  if (nvml_->utilization(device_handle_, &u) == kNvmlSuccess) {
    sum_ += u.gpu;
    ++samples_;
  }
}

std::optional<double> GpuMonitor::mean_utilization() const {
  if (!available_ || samples_ == 0 || running_) return std::nullopt;
  return sum_ / static_cast<double>(samples_);
}

std::string GpuMonitor::describe(bool enabled) const {
  if (!enabled) return "off: --no-gpu-monitor";
  if (!available_) return reason_;
  return "NVML, " + std::to_string(samples()) + (from_buffer_ ? " driver samples" : " readings");
}

std::string format_utilization(const std::optional<double>& percent) {
  if (!percent) return "n/a";
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", *percent);
  return text;
}

}  // namespace tandem::run
