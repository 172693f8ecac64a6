// The benchmark front end: resolve options, build the workload, time the steady state, report.
#include "tandem/bench.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tandem/error.h"
#include "tandem/gpu_monitor.h"
#include "tandem/lane.h"
#include "tandem/progress.h"
#include "tandem/runner.h"

namespace tandem {

namespace {
void synchronize(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}
}  // namespace

std::string device_name(c10::Device device) {
  if (!device.is_cuda()) return "cpu";
  return at::cuda::getDeviceProperties(device.index())->name;
}

BenchOptions resolve(BenchOptions o) {
  TANDEM_CHECK_ARG(static_cast<bool>(o.workload.make),
                   "no workload to run: set BenchOptions::workload (a WorkloadEntry)");
  const c10::Device device = parse_device(o.device);
  o.device = device.str();
  const BenchDefaults& d = device.is_cuda() ? kGpuBenchDefaults : kCpuBenchDefaults;
  check_params(o.workload.name, o.params, o.workload.params);
  o.batch_size = o.batch_size.value_or(device.is_cuda() ? o.workload.gpu_batch_size
                                                        : o.workload.cpu_batch_size);
  o.steps = o.steps.value_or(d.steps);
  o.warmup = o.warmup.value_or(d.warmup);
  o.workers = o.workers.value_or(d.workers);
  o.cudnn_benchmark = o.cudnn_benchmark.value_or(device.is_cuda());
  TANDEM_CHECK_ARG(o.train_priority == "high" || o.train_priority == "normal",
                   "train priority '", o.train_priority, "' is not valid: expected high or normal");
  TANDEM_CHECK_ARG(*o.batch_size > 0, "batch size ", *o.batch_size,
                   " is not valid: expected a positive number of samples");
  TANDEM_CHECK_ARG(*o.steps > 0, "step count ", *o.steps,
                   " is not valid: expected a positive number of timed steps");
  TANDEM_CHECK_ARG(*o.warmup >= 0, "warm-up count ", *o.warmup,
                   " is not valid: expected 0 or more warm-up steps");
  TANDEM_CHECK_ARG(*o.workers > 0 && *o.workers <= kMaxLoaderWorkers, "worker count ",
                   *o.workers, " is not valid: expected 1 to ", kMaxLoaderWorkers,
                   " loader worker threads");
  TANDEM_CHECK_ARG(o.kernel_steps >= 0, "kernel profile step count ", o.kernel_steps,
                   " is not valid: expected 0 (none) or more steps");
  TANDEM_CHECK_ARG(o.device_timing_every >= 1, "device timing interval ", o.device_timing_every,
                   " is not valid: expected a positive number of steps");
  return o;
}

BenchResult run_bench(const BenchOptions& unresolved) {
  const BenchOptions options = resolve(unresolved);
  TANDEM_CHECK_ARG(options.mode != Mode::kAuto,
                   "mode auto runs through run_auto(), not run_bench()");
  const int64_t batch_size = *options.batch_size, steps = *options.steps,
                warmup = *options.warmup;
  const c10::Device device = parse_device(options.device);
  BenchResult result;
  result.options = options;
  result.device_name = device_name(device);
  result.torch_version = TORCH_VERSION;

  at::globalContext().setBenchmarkCuDNN(*options.cudnn_benchmark);
  WorkloadOptions wo;
  wo.batch_size = batch_size;
  wo.workers = *options.workers;
  wo.device = device;
  wo.seed = options.seed;
  wo.params = options.params;
  wo.data = options.data;
  wo.rank = options.rank;
  wo.world_size = options.world_size;
  RunOptions ro;
  ro.rank = options.rank;
  ro.world_size = options.world_size;
  ro.mode = options.mode;
  ro.batch_size = batch_size;
  ro.workers = *options.workers;
  ro.seed = options.seed;
  ro.skip_bad = options.skip_bad;
  ro.first_step = options.first_step;
  ro.train_priority =
      options.train_priority == "high" ? LanePriority::kHigh : LanePriority::kNormal;
  std::unique_ptr<Trace> trace;
  if (!options.trace_path.empty()) {
    trace = std::make_unique<Trace>();
    ro.trace = trace.get();
  }
  Workload workload = options.workload.make(wo);
  if (options.prepare_workload) options.prepare_workload(workload);
  Runner runner(workload, ro);
  // Profiled steps follow the timed ones, and one more step after them is where the profiler
  // stops: on the thread that started it (the clock stage's), once their work is done.
  const int64_t profiled = options.kernel_steps;
  const int64_t total_steps = warmup + steps + (profiled > 0 ? profiled + 1 : 0);
  Pipeline* pipeline = &runner.prepare(total_steps);

  // The clock starts when step `warmup` begins its exclusive work: in serial mode when it
  // enters the first stage; pipelined, when it enters the last (training) stage, so exactly
  // `steps` training steps remain and the stages ahead of it are in their steady state.
  const int clock_stage =
      pipeline->mode() == PipelineMode::kSerial ? 0 : pipeline->num_stages() - 1;
  pipeline->set_timing(warmup, options.device_timing_every);
  pipeline->set_trace(trace.get());
  GpuMonitor monitor(device);
  Progress progress(options.workload.name + " " + to_string(options.mode), total_steps,
                    options.progress);
  const int last_stage = pipeline->num_stages() - 1;
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now(), end{};
  std::unique_ptr<KernelRecorder> recorder;
  runner.run([&](int stage, int64_t item) {
    if (options.cancel && options.cancel->load(std::memory_order_relaxed))
      throw Error("cancelled before this step");
    if (stage == clock_stage && item == warmup) {
      synchronize(device);
      start = Clock::now();
      if (options.gpu_monitor) monitor.start();
    }
    if (stage == clock_stage && profiled > 0 && item == warmup + steps) {
      synchronize(device);
      end = Clock::now();
      monitor.stop();
      recorder = std::make_unique<KernelRecorder>();
    }
    if (stage == clock_stage && profiled > 0 && item == warmup + steps + profiled) {
      synchronize(device);
      result.kernels = recorder->stop(profiled);
    }
    if (stage == last_stage) {
      progress.update(item);
      if (options.before_train_step) {
        const LaneGuard guard(pipeline->lane_of(last_stage), "before the train step");
        options.before_train_step(options.first_step + item);
      }
    }
  });
  synchronize(device);
  monitor.stop();
  progress.finish();
  if (profiled == 0) end = Clock::now();
  result.seconds = std::chrono::duration<double>(end - start).count();
  result.steps_per_s = static_cast<double>(steps) / result.seconds;
  result.samples_per_s = result.steps_per_s * static_cast<double>(batch_size);
  result.losses = runner.losses();
  result.timing = pipeline->timing();
  result.notes = runner.notes();
  result.skipped = runner.skipped();
  result.gpu_utilization = monitor.mean_utilization();
  result.gpu_utilization_note =
      !options.gpu_monitor ? "off: --no-gpu-monitor"
      : monitor.available()
          ? detail::concat("NVML, ", monitor.samples(),
                           monitor.from_driver_buffer() ? " driver samples" : " readings")
          : monitor.unavailable_reason();
  // The floor is the slowest stage's GPU time: the rate a pipeline approaches. On the CPU the
  // stages share the same cores, so no one stage bounds the step and there is no floor.
  for (const auto& st : result.timing.stages) {
    if (!device.is_cuda()) break;
    if (st.device_ms_per_item > result.floor_ms) {
      result.floor_ms = st.device_ms_per_item;
      result.floor_stage = st.name;
    }
  }
  if (result.floor_ms > 0) result.efficiency = result.steps_per_s * result.floor_ms / 1000.0;
  if (trace) trace->write(options.trace_path);  // throws if the file cannot be written
  return result;
}

std::string describe_config(const BenchOptions& o) {
  std::ostringstream os;
  os << "workload   " << o.workload.name << "\n";
  for (const auto& [key, value] : o.params) os << "param      " << key << "=" << value << "\n";
  if (!o.data.empty()) os << "data       " << o.data << (o.skip_bad ? " (--skip-bad)" : "") << "\n";
  os << "mode       " << to_string(o.mode) << "\n"
     << "device     " << o.device << " (" << device_name(parse_device(o.device)) << ")\n"
     << "batch size " << o.batch_size.value_or(0) << "\n"
     << "steps      " << o.steps.value_or(0) << " timed after " << o.warmup.value_or(0)
     << " warm-up\n"
     << "workers    " << o.workers.value_or(0) << "\n"
     << "seed       " << o.seed << "\n"
     << "cudnn      benchmark " << (o.cudnn_benchmark.value_or(false) ? "on" : "off") << "\n"
     << "train lane priority " << o.train_priority << "\n";
  return os.str();
}

std::string describe_result(const BenchResult& r) {
  char line[256];
  std::ostringstream os;
  std::snprintf(line, sizeof line, "%-9s %-17s %6s %10s %11s %9s %11s %11s\n", "workload",
                "mode", "batch", "steps/s", "samples/s", "ms/step", "first loss", "last loss");
  os << line;
  std::snprintf(line, sizeof line, "%-9s %-17s %6lld %10.2f %11.1f %9.3f %11.5f %11.5f\n",
                r.options.workload.name.c_str(), to_string(r.options.mode),
                static_cast<long long>(r.options.batch_size.value_or(0)), r.steps_per_s, r.samples_per_s,
                1000.0 / r.steps_per_s, r.losses.empty() ? 0.0 : r.losses.front(),
                r.losses.empty() ? 0.0 : r.losses.back());
  os << line;
  os << "\nper step    " << "host enqueue ms   device ms   (lane)";
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
  std::snprintf(line, sizeof line, "  %-10s %15.3f   (host blocked on a ring slot: device behind)\n",
                "slot wait", r.timing.slot_wait_ms_per_item);
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
    if (r.skipped.size() > 10) os << "  ... and " << r.skipped.size() - 10 << " more (--json lists them)\n";
  }
  if (r.kernels) os << "\n" << describe_kernels(*r.kernels);
  return os.str();
}

nlohmann::json to_json(const BenchResult& r) {
  const auto& o = r.options;
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
          {"mode", to_string(o.mode)},
          {"batch_size", o.batch_size.value_or(0)},
          {"steps", o.steps.value_or(0)},
          {"warmup", o.warmup.value_or(0)},
          {"workers", o.workers.value_or(0)},
          {"seed", o.seed},
          {"cudnn_benchmark", o.cudnn_benchmark.value_or(false)},
          {"train_priority", o.train_priority},
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
          // null without a GPU: no floor there (run_bench says why).
          {"floor_ms", r.floor_ms > 0 ? nlohmann::json(r.floor_ms) : nlohmann::json(nullptr)},
          {"floor_stage", r.floor_stage},
          {"efficiency", r.floor_ms > 0 ? nlohmann::json(r.efficiency) : nlohmann::json(nullptr)},
          {"gpu_utilization", r.gpu_utilization ? nlohmann::json(*r.gpu_utilization)
                                                : nlohmann::json(nullptr)},
          {"gpu_utilization_note", r.gpu_utilization_note},
          {"notes", r.notes},
          {"kernels", r.kernels ? to_json(*r.kernels) : nlohmann::json(nullptr)}};
}

}  // namespace tandem
