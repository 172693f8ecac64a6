// GPU utilization read through NVML while a benchmark runs. NVML is loaded at run time
// (dlopen of the driver's libnvidia-ml.so.1), so tandem builds without nvml.h and runs where
// there is no driver: utilization is then "n/a", never a crash.
#pragma once

#include <c10/core/Device.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace tandem::run {

/// The utilization of one GPU between start() and stop().
///
///   start() ── reader thread: every `period`, the driver's new samples ── stop(): the rest
///
/// The driver samples utilization itself (every 1/6 s to 1 s, by GPU) into a buffer that
/// nvmlDeviceGetSamples reads; each sample is the percentage of its period during which at least
/// one kernel ran — a busy-ness measure, not an SM occupancy measure. The reader only collects
/// those samples, so it can be slow: a run with an NVML call every 20 ms measured 2% slower
/// (mlp on the H200, docs/notes/pipeline-and-graphs.md) than the same run without. Where the driver
/// keeps no samples, the reader falls back to nvmlDeviceGetUtilizationRates (the last period's
/// figure) on each wake-up; a run shorter than one period gets one such reading at stop().
class GpuMonitor {
 public:
  /// `library` is the NVML shared object to load (tests pass a missing one).
  explicit GpuMonitor(c10::Device device, std::string library = "libnvidia-ml.so.1",
                      int period_ms = 1000);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  /// Whether NVML loaded and the device was found; if not, why (for the report).
  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return reason_; }

  void start();
  void stop();
  /// Mean utilization in percent over the samples taken between start() and stop();
  /// nullopt when unavailable, still running, or no sample was taken.
  std::optional<double> mean_utilization() const;
  /// How many samples the mean is over (0 while running or unavailable).
  int64_t samples() const { return running_ ? 0 : samples_; }
  /// Whether the samples came from the driver's buffer (else from one reading per wake-up).
  bool from_driver_buffer() const { return from_buffer_; }
  /// Where a report's utilization came from ("NVML, 12 driver samples"), or why there is none
  /// (`enabled` false: the run turned the monitor off).
  std::string describe(bool enabled) const;

 private:
  struct Nvml;
  static const Nvml& loaded_nvml(const std::string& library);  // once per process
  void collect();       // the driver's samples newer than last_seen_us_, or one reading
  void read_current();  // one nvmlDeviceGetUtilizationRates reading

  const Nvml* nvml_ = nullptr;  // the process's (loaded once); null when unavailable
  void* device_handle_ = nullptr;
  bool available_ = false;
  std::string reason_;
  int period_ms_;
  bool running_ = false;  // touched by the caller's thread only
  std::thread reader_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  // Written by the reader thread while running, by stop() after joining it.
  uint64_t last_seen_us_ = 0;  // driver timestamps (microseconds): samples after start() only
  bool from_buffer_ = false;
  double sum_ = 0;
  int64_t samples_ = 0;
};

/// "n/a" or e.g. "87.5%": how reports print an optional utilization.
std::string format_utilization(const std::optional<double>& percent);

}  // namespace tandem::run
