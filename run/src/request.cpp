// A run's request: its defaults, its checks, and the core's options it becomes.
#include "tandem/run/request.h"

#include <optional>
#include <sstream>

#include "tandem/cuda_wait.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/error.h"
#include "tandem/hardware_queues.h"
#include "tandem/loader.h"
#include "tandem/run/report.h"

namespace tandem::run {

std::string mode_name(const RunMode& mode) { return mode ? to_string(*mode) : "auto"; }

std::string describe_mode(const RunMode& mode) {
  return mode ? describe(*mode) : "short trials of every mode, then the fastest";
}

std::vector<RunMode> run_modes() {
  std::vector<RunMode> modes(workload_modes().begin(), workload_modes().end());
  modes.push_back(std::nullopt);
  return modes;
}

namespace {
// A lane priority as a request names it ("high" or "normal"); `which` names the option in the
// error ("train", "input").
LanePriority parse_lane_priority(const std::string& value, const char* which) {
  TANDEM_CHECK_ARG(value == "high" || value == "normal", which, " priority '", value,
                   "' is not valid: expected high or normal");
  return value == "high" ? LanePriority::kHigh : LanePriority::kNormal;
}
}  // namespace

RunMode parse_run_mode(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (const Mode m : workload_modes())
    if (name == to_string(m)) return m;
  std::vector<std::string> names;
  for (const RunMode& m : run_modes()) names.push_back(mode_name(m));
  throw InvalidArgument("mode '" + name + "' is not valid: expected " + join_choices(names));
}

RunRequest resolve(RunRequest o) {
  TANDEM_CHECK_ARG(static_cast<bool>(o.workload.make),
                   "no workload to run: set RunRequest::workload (a WorkloadEntry)");
  const c10::Device device = parse_device(o.device);
  o.device = device.str();
  const RunDefaults& d = device.is_cuda() ? kGpuRunDefaults : kCpuRunDefaults;
  check_params(o.workload.name, o.params, o.workload.params);
  o.batch_size = o.batch_size.value_or(device.is_cuda() ? o.workload.gpu_batch_size
                                                        : o.workload.cpu_batch_size);
  o.steps = o.steps.value_or(d.steps);
  o.warmup = o.warmup.value_or(d.warmup);
  o.workers = o.workers.value_or(default_loader_workers(device));
  o.cudnn_benchmark = o.cudnn_benchmark.value_or(device.is_cuda());
  TANDEM_CHECK_ARG(o.cudnn_benchmark_limit.value_or(0) >= 0, "cuDNN benchmark limit ",
                   o.cudnn_benchmark_limit.value_or(0),
                   " is not valid: expected 0 (every algorithm) or a positive count");
  parse_lane_priority(o.train_priority, "train");
  parse_lane_priority(o.input_priority, "input");
  parse_cuda_wait(o.cuda_wait);
  TANDEM_CHECK_ARG(*o.batch_size > 0, "batch size ", *o.batch_size,
                   " is not valid: expected a positive number of samples");
  TANDEM_CHECK_ARG(*o.steps > 0, "step count ", *o.steps,
                   " is not valid: expected a positive number of timed steps");
  TANDEM_CHECK_ARG(*o.warmup >= 0, "warm-up count ", *o.warmup,
                   " is not valid: expected 0 or more warm-up steps");
  TANDEM_CHECK_ARG(*o.workers > 0 && *o.workers <= kMaxLoaderWorkers, "worker count ", *o.workers,
                   " is not valid: expected 1 to ", kMaxLoaderWorkers, " loader worker threads");
  TANDEM_CHECK_ARG(o.kernel_steps >= 0, "kernel profile step count ", o.kernel_steps,
                   " is not valid: expected 0 (none) or more steps");
  TANDEM_CHECK_ARG(o.kernel_trace_path.empty() || o.kernel_steps > 0, "a kernel trace ('",
                   o.kernel_trace_path,
                   "') records the profiled steps: give their count too "
                   "(--kernels N)");
  TANDEM_CHECK_ARG(o.device_timing_every >= 1, "device timing interval ", o.device_timing_every,
                   " is not valid: expected a positive number of steps");
  return o;
}

WorkloadOptions workload_options(const RunRequest& r) {
  WorkloadOptions wo;
  wo.batch_size = r.batch_size.value();
  wo.workers = r.workers.value();
  wo.device = parse_device(r.device);
  wo.seed = r.seed;
  wo.params = r.params;
  wo.data = r.data;
  wo.rank = r.rank;
  wo.world_size = r.world_size;
  return wo;
}

RunOptions runner_options(const RunRequest& r) {
  RunOptions ro;
  TANDEM_CHECK_ARG(r.mode.has_value(),
                   "mode auto is resolved first (resolve_mode), then run with the mode it picked");
  ro.mode = *r.mode;
  ro.batch_size = r.batch_size.value();
  ro.workers = r.workers.value();
  ro.seed = r.seed;
  ro.rank = r.rank;
  ro.world_size = r.world_size;
  ro.skip_bad = r.skip_bad;
  ro.first_step = r.first_step;
  ro.train_priority = parse_lane_priority(r.train_priority, "train");
  ro.input_priority = parse_lane_priority(r.input_priority, "input");
  return ro;
}

std::string describe_request(const RunRequest& o) {
  std::ostringstream os;
  os << "workload   " << o.workload.name << "\n";
  for (const auto& [key, value] : o.params) os << "param      " << key << "=" << value << "\n";
  if (!o.data.empty()) os << "data       " << o.data << (o.skip_bad ? " (--skip-bad)" : "") << "\n";
  os << "mode       " << mode_name(o.mode) << "\n"
     << "device     " << o.device << " (" << device_name(parse_device(o.device)) << ")\n"
     << "batch size " << o.batch_size.value_or(0) << "\n"
     << "steps      " << o.steps.value_or(0) << " timed after " << o.warmup.value_or(0)
     << " warm-up\n"
     << "workers    " << o.workers.value_or(0) << "\n"
     << "seed       " << o.seed << "\n"
     << "cudnn      benchmark " << (o.cudnn_benchmark.value_or(false) ? "on" : "off")
     << (o.cudnn_benchmark_limit ? ", limit " + std::to_string(*o.cudnn_benchmark_limit) : "")
     << "\n"
     << "train lane priority " << o.train_priority << "\n"
     << "input lanes priority " << o.input_priority << "\n"
     << "CUDA waits " << o.cuda_wait << "\n"
     << "hardware queues " << hardware_queues() << " (CUDA_DEVICE_MAX_CONNECTIONS)\n";
  return os.str();
}

}  // namespace tandem::run
