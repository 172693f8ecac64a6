// What a run of a workload measured (run_workload.h): its rate, each stage's host and device
// time, the floor its slowest stage sets, GPU utilization, the runner's notes — and its forms
// for a terminal (a table) and for files (JSON).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tandem/detail/stage_timing.h"
#include "tandem/run/kernel_profile.h"
#include "tandem/run/request.h"

namespace tandem::run {

struct RunReport {
  RunRequest request;       ///< resolved
  std::string device_name;  ///< e.g. "NVIDIA H200" or "cpu"
  std::string torch_version;
  double seconds = 0;  ///< wall time of the timed steps
  double steps_per_s = 0;
  double samples_per_s = 0;
  std::vector<float> losses;  ///< every step, warm-up included
  StageTiming timing;         ///< per stage, over the timed steps
  /// NVML's mean GPU utilization over the timed steps, or nullopt (see gpu_utilization_note).
  std::optional<double> gpu_utilization;
  std::string gpu_utilization_note;
  /// The slowest stage of this run, ms per step: device time on a GPU, host time on the CPU.
  /// Its rate, 1000 / floor_ms, is what perfect overlap of the stages would reach.
  double floor_ms = 0;
  std::string floor_stage;
  /// steps_per_s / (1000 / floor_ms).
  double efficiency = 0;
  std::vector<std::string> notes;        ///< the runner's (Runner::notes)
  std::vector<SkippedSample> skipped;    ///< samples left out (skip_bad), each with why
  std::optional<KernelProfile> kernels;  ///< with kernel_steps
};

/// "cpu", or the GPU's name ("NVIDIA H200").
std::string device_name(c10::Device device);

class GpuMonitor;  // gpu_monitor.h

/// Fills in what a run on `device` measured, once the report's request and timing are in: the
/// device's name and torch's version, `steps` over `seconds` as its rates, the utilization
/// `monitor` read (stopped), and the floor — the slowest stage's device time per step, which
/// stage, the efficiency against it; on the CPU none (the stages share the cores). run_workload
/// and a Python fit report through it.
void set_measurements(RunReport& report, c10::Device device, int64_t steps, double seconds,
                      const GpuMonitor& monitor);

/// A fixed-width table of the report.
std::string describe_report(const RunReport& report);
nlohmann::json to_json(const RunReport& report);

}  // namespace tandem::run
