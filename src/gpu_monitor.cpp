// NVML through dlopen: the few entry points tandem needs, declared here with NVML's C ABI.
#include "tandem/gpu_monitor.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>

namespace tandem {

namespace {
// NVML's C types, as its public header defines them (an opaque handle; two unsigned ints).
using NvmlReturn = int;  // NVML_SUCCESS == 0
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
}  // namespace

struct GpuMonitor::Nvml {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  ~Nvml() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }
};

GpuMonitor::GpuMonitor(c10::Device device, std::string library, int period_ms)
    : period_ms_(period_ms) {
  if (!device.is_cuda()) {
    reason_ = "not a CUDA device";
    return;
  }
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    reason_ = "NVML not found (" + library + ")";
    return;
  }
  nvml_ = new Nvml;
  nvml_->library = lib;
  nvml_->init = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib, "nvmlInit_v2"));
  nvml_->shutdown = nullptr;  // set only once init succeeded
  nvml_->by_pci_bus_id = reinterpret_cast<NvmlReturn (*)(const char*, NvmlDevice*)>(
      dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  nvml_->utilization = reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlUtilization*)>(
      dlsym(lib, "nvmlDeviceGetUtilizationRates"));
  if (!nvml_->init || !nvml_->by_pci_bus_id || !nvml_->utilization) {
    reason_ = "NVML lacks the functions tandem needs";
    return;
  }
  if (nvml_->init() != 0) {
    reason_ = "nvmlInit failed";
    return;
  }
  nvml_->shutdown = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib, "nvmlShutdown"));
  // CUDA and NVML number devices differently (CUDA_VISIBLE_DEVICES): match them by PCI bus id.
  char bus_id[32] = {0};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device.index()) != cudaSuccess) {
    reason_ = "no PCI bus id for " + device.str();
    return;
  }
  if (nvml_->by_pci_bus_id(bus_id, &device_handle_) != 0) {
    reason_ = std::string("NVML does not know device ") + bus_id;
    return;
  }
  available_ = true;
}

GpuMonitor::~GpuMonitor() {
  stop();
  delete nvml_;
}

void GpuMonitor::start() {
  if (!available_ || running_.exchange(true)) return;
  sum_ = 0;
  samples_ = 0;
  sampler_ = std::thread([this] {
    while (running_.load()) {
      NvmlUtilization u{};
      if (nvml_->utilization(device_handle_, &u) == 0) {
        sum_ += u.gpu;
        ++samples_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms_));
    }
  });
}

void GpuMonitor::stop() {
  if (!running_.exchange(false)) return;
  if (sampler_.joinable()) sampler_.join();
}

std::optional<double> GpuMonitor::mean_utilization() const {
  if (!available_ || samples_ == 0 || running_.load()) return std::nullopt;
  return sum_ / static_cast<double>(samples_);
}

std::string format_utilization(const std::optional<double>& percent) {
  if (!percent) return "n/a";
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", *percent);
  return text;
}

}  // namespace tandem
