// A run's report as a table for a terminal and as JSON for files.
#include "tandem/run/report.h"

#include <ATen/cuda/CUDAContext.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "tandem/hardware_queues.h"
#include "tandem/run/gpu_monitor.h"

namespace tandem::run {

void set_measurements(RunReport& report, c10::Device device, int64_t steps, double seconds,
                      const GpuMonitor& monitor) {
  report.device_name = device_name(device);
  report.torch_version = TORCH_VERSION;
  report.seconds = seconds;
  report.steps_per_s = seconds > 0 ? static_cast<double>(steps) / seconds : 0;
  report.samples_per_s =
      report.steps_per_s * static_cast<double>(report.request.batch_size.value());
  report.gpu_utilization = monitor.mean_utilization();
  report.gpu_utilization_note = monitor.describe(report.request.gpu_monitor);
  // The floor is the slowest stage's GPU time: the rate a pipeline approaches. On the CPU the
  // stages share the same cores, so no one stage bounds the step and there is no floor.
  if (!device.is_cuda()) return;
  for (const auto& st : report.timing.stages)
    if (st.device_ms_per_item > report.floor_ms) {
      report.floor_ms = st.device_ms_per_item;
      report.floor_stage = st.name;
    }
  if (report.floor_ms > 0) report.efficiency = report.steps_per_s * report.floor_ms / 1000.0;
}

std::string device_name(c10::Device device) {
  if (!device.is_cuda()) return "cpu";
  return at::cuda::getDeviceProperties(device.index())->name;
}

std::string describe_report(const RunReport& r) {
  char line[256];
  std::ostringstream os;
  std::snprintf(line, sizeof line, "%-9s %-17s %6s %10s %11s %9s %11s %11s\n", "workload", "mode",
                "batch", "steps/s", "samples/s", "ms/step", "first loss", "last loss");
  os << line;
  std::snprintf(line, sizeof line, "%-9s %-17s %6lld %10.2f %11.1f %9.3f %11.5f %11.5f\n",
                r.request.workload.name.c_str(), mode_name(r.request.mode).c_str(),
                static_cast<long long>(r.request.batch_size.value_or(0)), r.steps_per_s,
                r.samples_per_s, 1000.0 / r.steps_per_s, r.losses.empty() ? 0.0 : r.losses.front(),
                r.losses.empty() ? 0.0 : r.losses.back());
  os << line;
  os << "\nper step    "
     << "host enqueue ms   device ms   (lane)";
  if (r.timing.device_timing_every > 1)
    os << "   device: mean of one step in every " << r.timing.device_timing_every;
  os << "\n";
  for (const auto& st : r.timing.stages) {
    char device_ms[32] = "n/a";  // no CUDA: no device timeline
    if (!std::isnan(st.device_ms_per_item))
      std::snprintf(device_ms, sizeof device_ms, "%.3f", st.device_ms_per_item);
    std::snprintf(line, sizeof line, "  %-10s %15.3f %11s   (%s)\n", st.name.c_str(),
                  st.host_ms_per_item, device_ms, st.lane.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line,
                "  %-10s %15.3f   (host blocked on a ring slot: device behind)\n", "slot wait",
                r.timing.slot_wait_ms_per_item);
  os << line;
  if (r.floor_ms > 0) {
    std::snprintf(line, sizeof line,
                  "\nfloor      %.3f ms/step (slowest stage: %s; %.1f steps/s)\n"
                  "efficiency %.2f (achieved / floor rate)\n",
                  r.floor_ms, r.floor_stage.c_str(), 1000.0 / r.floor_ms, r.efficiency);
    os << line;
  } else {
    os << "\nfloor      n/a (no GPU: the stages share the CPU's cores)\n";
  }
  os << "GPU util   " << format_utilization(r.gpu_utilization)
     << (r.gpu_utilization ? "" : " (" + r.gpu_utilization_note + ")") << "\n";
  for (const auto& note : r.notes) os << "note       " << note << "\n";
  if (!r.skipped.empty()) {
    os << "skipped    " << r.skipped.size() << " bad sample" << (r.skipped.size() == 1 ? "" : "s")
       << " (--skip-bad):\n";
    for (size_t i = 0; i < r.skipped.size() && i < 10; ++i)
      os << "  sample " << r.skipped[i].index << ": " << r.skipped[i].reason << "\n";
    if (r.skipped.size() > 10)
      os << "  ... and " << r.skipped.size() - 10 << " more (--json lists them)\n";
  }
  if (r.kernels) os << "\n" << describe_kernels(*r.kernels);
  return os.str();
}

nlohmann::json to_json(const RunReport& r) {
  const auto& o = r.request;
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : r.timing.stages)
    stages.push_back({{"name", st.name},
                      {"lane", st.lane},
                      {"host_ms_per_step", st.host_ms_per_item},
                      {"device_ms_per_step", std::isnan(st.device_ms_per_item)
                                                 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(st.device_ms_per_item)}});
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& s : r.skipped) skipped.push_back({{"index", s.index}, {"reason", s.reason}});
  return {{"impl", "tandem"},
          {"scenario", o.workload.name},
          {"data", o.data.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.data)},
          {"skip_bad", o.skip_bad},
          {"skipped_count", r.skipped.size()},
          {"skipped", skipped},
          {"params", o.params},
          {"mode", mode_name(o.mode)},
          {"batch_size", o.batch_size.value_or(0)},
          {"steps", o.steps.value_or(0)},
          {"warmup", o.warmup.value_or(0)},
          {"workers", o.workers.value_or(0)},
          {"seed", o.seed},
          {"cudnn_benchmark", o.cudnn_benchmark.value_or(false)},
          {"cudnn_benchmark_limit", at::globalContext().benchmarkLimitCuDNN()},
          {"train_priority", o.train_priority},
          {"input_priority", o.input_priority},
          {"cuda_wait", o.cuda_wait},
          {"hardware_queues", hardware_queues()},
          {"device", o.device},
          {"device_name", r.device_name},
          {"torch", r.torch_version},
          {"seconds", r.seconds},
          {"steps_per_s", r.steps_per_s},
          {"samples_per_s", r.samples_per_s},
          {"ms_per_step", 1000.0 / r.steps_per_s},
          {"first_loss", r.losses.empty() ? 0.0 : r.losses.front()},
          {"last_loss", r.losses.empty() ? 0.0 : r.losses.back()},
          {"losses", r.losses},
          {"stages", stages},
          {"slot_wait_ms_per_step", r.timing.slot_wait_ms_per_item},
          {"device_timing_every", r.timing.device_timing_every},
          // null without a GPU: no floor there (run_workload says why).
          {"floor_ms", r.floor_ms > 0 ? nlohmann::json(r.floor_ms) : nlohmann::json(nullptr)},
          {"floor_stage", r.floor_stage},
          {"efficiency", r.floor_ms > 0 ? nlohmann::json(r.efficiency) : nlohmann::json(nullptr)},
          {"gpu_utilization",
           r.gpu_utilization ? nlohmann::json(*r.gpu_utilization) : nlohmann::json(nullptr)},
          {"gpu_utilization_note", r.gpu_utilization_note},
          {"notes", r.notes},
          {"kernels", r.kernels ? to_json(*r.kernels) : nlohmann::json(nullptr)}};
}

}  // namespace tandem::run
