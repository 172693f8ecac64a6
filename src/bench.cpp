// The benchmark runner: resolve options, build the scenario, time the steady state, report.
#include "tandem/bench.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "tandem/error.h"
#include "tandem/lane.h"
#include "tandem/scenario.h"

namespace tandem {

namespace {
void synchronize(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}

std::string device_name(c10::Device device) {
  if (!device.is_cuda()) return "cpu";
  return at::cuda::getDeviceProperties(device.index())->name;
}
}  // namespace

BenchOptions resolve(BenchOptions o) {
  const c10::Device device = parse_device(o.device);
  o.device = device.str();
  const BenchDefaults& d = device.is_cuda() ? kGpuBenchDefaults : kCpuBenchDefaults;
  const auto modes = scenario_modes(o.scenario);  // throws for an unknown scenario
  TANDEM_CHECK_ARG(std::find(modes.begin(), modes.end(), o.mode) != modes.end(), "mode '",
                   o.mode, "' is not valid for scenario ", o.scenario, ": expected ",
                   join_choices(modes));
  o.batch_size = o.batch_size.value_or(d.batch_size);
  o.steps = o.steps.value_or(d.steps);
  o.warmup = o.warmup.value_or(d.warmup);
  o.workers = o.workers.value_or(d.workers);
  TANDEM_CHECK_ARG(*o.batch_size > 0, "batch size ", *o.batch_size,
                   " is not valid: expected a positive number of samples");
  TANDEM_CHECK_ARG(*o.steps > 0, "step count ", *o.steps,
                   " is not valid: expected a positive number of timed steps");
  TANDEM_CHECK_ARG(*o.warmup >= 0, "warm-up count ", *o.warmup,
                   " is not valid: expected 0 or more warm-up steps");
  TANDEM_CHECK_ARG(*o.workers > 0, "worker count ", *o.workers,
                   " is not valid: expected at least 1 loader worker");
  return o;
}

BenchResult run_bench(const BenchOptions& unresolved) {
  const BenchOptions options = resolve(unresolved);
  const int64_t batch_size = *options.batch_size, steps = *options.steps,
                warmup = *options.warmup;
  const c10::Device device = parse_device(options.device);
  BenchResult result;
  result.options = options;
  result.device_name = device_name(device);
  result.torch_version = TORCH_VERSION;

  ScenarioOptions so;
  so.batch_size = batch_size;
  so.workers = *options.workers;
  so.seed = options.seed;
  so.device = device;
  auto scenario = make_scenario(options.scenario, so);
  auto pipeline = scenario->prepare(options.mode, warmup + steps);

  // The clock starts when the last stage is about to train step `warmup`: then exactly `steps`
  // training steps remain, and the stages ahead of it are already in their steady state.
  const int64_t start_tick = warmup + pipeline->depth() - 1;
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  pipeline->run(warmup + steps, [&](int64_t tick) {
    if (tick == start_tick) {
      synchronize(device);
      start = Clock::now();
    }
  });
  synchronize(device);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.steps_per_s = static_cast<double>(steps) / result.seconds;
  result.samples_per_s = result.steps_per_s * static_cast<double>(batch_size);
  result.losses = scenario->losses();
  return result;
}

std::string describe_config(const BenchOptions& o) {
  std::ostringstream os;
  os << "scenario   " << o.scenario << "\n"
     << "mode       " << o.mode << "\n"
     << "device     " << o.device << " (" << device_name(parse_device(o.device)) << ")\n"
     << "batch size " << o.batch_size.value_or(0) << "\n"
     << "steps      " << o.steps.value_or(0) << " timed after " << o.warmup.value_or(0)
     << " warm-up\n"
     << "workers    " << o.workers.value_or(0) << "\n"
     << "seed       " << o.seed << "\n";
  return os.str();
}

std::string describe_result(const BenchResult& r) {
  char line[256];
  std::ostringstream os;
  std::snprintf(line, sizeof line, "%-9s %-10s %6s %10s %11s %9s %11s %11s\n", "scenario",
                "mode", "batch", "steps/s", "samples/s", "ms/step", "first loss", "last loss");
  os << line;
  std::snprintf(line, sizeof line, "%-9s %-10s %6lld %10.2f %11.1f %9.3f %11.5f %11.5f\n",
                r.options.scenario.c_str(), r.options.mode.c_str(),
                static_cast<long long>(r.options.batch_size.value_or(0)), r.steps_per_s, r.samples_per_s,
                1000.0 / r.steps_per_s, r.losses.empty() ? 0.0 : r.losses.front(),
                r.losses.empty() ? 0.0 : r.losses.back());
  os << line;
  return os.str();
}

nlohmann::json to_json(const BenchResult& r) {
  const auto& o = r.options;
  return {{"impl", "tandem"},
          {"scenario", o.scenario},
          {"mode", o.mode},
          {"batch_size", o.batch_size.value_or(0)},
          {"steps", o.steps.value_or(0)},
          {"warmup", o.warmup.value_or(0)},
          {"workers", o.workers.value_or(0)},
          {"seed", o.seed},
          {"device", o.device},
          {"device_name", r.device_name},
          {"torch", r.torch_version},
          {"seconds", r.seconds},
          {"steps_per_s", r.steps_per_s},
          {"samples_per_s", r.samples_per_s},
          {"ms_per_step", 1000.0 / r.steps_per_s},
          {"first_loss", r.losses.empty() ? 0.0 : r.losses.front()},
          {"last_loss", r.losses.empty() ? 0.0 : r.losses.back()},
          {"losses", r.losses}};
}

}  // namespace tandem
