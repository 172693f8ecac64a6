// GPU utilization sampled through NVML while a benchmark runs. NVML is loaded at run time
// (dlopen of the driver's libnvidia-ml.so.1), so tandem builds without nvml.h and runs where
// there is no driver: utilization is then "n/a", never a crash.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include <c10/core/Device.h>

namespace tandem {

/// Samples the utilization of one GPU on a background thread between start() and stop().
///
///   start() ── sampler thread: every `period`, nvmlDeviceGetUtilizationRates ── stop()
///
/// NVML's figure is the percentage of the last sample period (1/6 s to 1 s, by driver) during
/// which at least one kernel ran: a busy-ness measure, not an SM occupancy measure.
class GpuMonitor {
 public:
  /// `library` is the NVML shared object to load (tests pass a missing one).
  explicit GpuMonitor(c10::Device device, std::string library = "libnvidia-ml.so.1",
                      int period_ms = 20);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  /// Whether NVML loaded and the device was found; if not, why (for the report).
  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return reason_; }

  void start();
  void stop();
  /// Mean utilization in percent over the samples taken between start() and stop();
  /// nullopt when unavailable or no sample was taken.
  std::optional<double> mean_utilization() const;

 private:
  struct Nvml;
  Nvml* nvml_ = nullptr;
  void* device_handle_ = nullptr;
  bool available_ = false;
  std::string reason_;
  int period_ms_;
  std::atomic<bool> running_{false};
  std::thread sampler_;
  double sum_ = 0;
  long samples_ = 0;
};

/// "n/a" or e.g. "87.5%": how reports print an optional utilization.
std::string format_utilization(const std::optional<double>& percent);

}  // namespace tandem
