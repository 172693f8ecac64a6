// join_data_parallel and friends (data_parallel.h).
#include "tandem/run/data_parallel.h"

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "tandem/distributed/launch_env.h"
#include "tandem/mode.h"

namespace tandem::run {

std::shared_ptr<distributed::ProcessGroup> join_data_parallel(
    const std::string& device_flag, const distributed::ProcessGroupOptions& options) {
  const std::optional<distributed::LaunchEnv> env = distributed::launch_env_from_environment();
  if (!env || env->world_size == 1) return nullptr;
  c10::Device device(c10::kCPU);
  if (device_flag != "cpu") {
    const int gpus = c10::cuda::device_count();
    if (device_flag.rfind("cuda:", 0) == 0)
      throw distributed::EnvironmentError(
          detail::concat("--device ", device_flag,
                         " under data parallel: each rank uses cuda:LOCAL_RANK; "
                         "expected --device cuda (or auto)"));
    if (gpus > 0) {
      if (env->local_world_size > gpus || env->local_rank >= gpus)
        throw distributed::EnvironmentError(detail::concat(
            "LOCAL_WORLD_SIZE=", env->local_world_size, " ranks on this machine but ", gpus,
            " GPU(s): expected at most one rank per GPU (or --device cpu)"));
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
      c10::cuda::set_device(device.index());
    } else if (device_flag == "cuda") {
      throw InvalidArgument("--device cuda: no CUDA device is available");
    }
  }
  return distributed::ProcessGroup::connect(*env, device, options);
}

void apply_data_parallel(RunRequest& options, RunHooks& hooks,
                         const std::shared_ptr<distributed::ProcessGroup>& group,
                         const distributed::DataParallelOptions& data_parallel) {
  if (!group) return;
  options.device = group->device().str();
  options.rank = group->rank();
  options.world_size = group->world_size();
  options.progress = options.progress && group->rank() == 0;
  options.gpu_monitor = options.gpu_monitor && group->rank() == 0;
  hooks.prepare_workload = [group, data_parallel](Workload& w) {
    distributed::make_data_parallel(w, group, data_parallel);
  };
}

double value_of_rank0(distributed::ProcessGroup& group, double value) {
  return group.all_reduce_host({group.rank() == 0 ? value : 0.0},
                               distributed::ProcessGroup::HostOp::kSum)[0];
}

ModeResolution resolve_mode_as_rank(const RunRequest& request, const RunHooks& hooks,
                                    distributed::ProcessGroup& group) {
  if (request.mode) return resolve_mode(request, hooks);
  RunHooks alone = hooks;
  alone.prepare_workload = nullptr;  // the trials: this rank by itself (and without progress)
  ModeResolution out;
  out.trials = run_trials(request, alone, &out.trial_seconds);
  // Every rank has the same trials in the same order (workload_modes()); rank 0's pick by its
  // index. A rank whose trials all failed still takes part, then fails with the others' pick
  // if that mode fails for it too.
  int picked = -1;
  try {
    out.decision = choose_mode(out.trials);
    for (size_t i = 0; i < out.trials.size(); ++i)
      if (out.trials[i].mode == out.decision.mode) picked = static_cast<int>(i);
  } catch (const std::exception& e) {
    out.decision = {"", e.what()};
  }
  const double rank0 = value_of_rank0(group, picked);
  if (rank0 < 0)
    throw Error(
        detail::concat("mode auto: every trial failed on rank 0 (", out.decision.reason, ")"));
  const std::string mode = out.trials.at(static_cast<size_t>(rank0)).mode;
  if (mode != out.decision.mode)
    out.decision = {mode, "rank 0's pick (this rank's trials: " +
                              (out.decision.mode.empty() ? "none ran" : out.decision.mode) + ")"};
  out.mode = parse_mode(mode);
  return out;
}

AutoReport run_auto_as_rank(const RunRequest& request, const RunHooks& hooks,
                            distributed::ProcessGroup& group) {
  AutoReport out;
  out.resolution = resolve_mode_as_rank(request, hooks, group);
  RunRequest run = request;
  run.mode = out.resolution.mode;
  out.report = run_workload(run, hooks);
  return out;
}

nlohmann::json reduce_over_ranks(RunReport& result, distributed::ProcessGroup& group) {
  // Losses: the mean over the ranks (the global batch's). Rates: every rank's; ranks run in
  // lockstep (an all-reduce per step), so they agree closely.
  const int world = group.world_size();
  std::vector<double> losses(result.losses.begin(), result.losses.end());
  losses = group.all_reduce_host(losses);
  result.losses.assign(losses.begin(), losses.end());
  std::vector<double> rates(world, 0.0);
  rates[group.rank()] = result.steps_per_s;
  rates = group.all_reduce_host(rates, distributed::ProcessGroup::HostOp::kSum);
  return {{"world_size", world},
          {"backend", group.backend()},
          {"steps_per_s_per_gpu", result.steps_per_s},
          {"steps_per_s_by_rank", rates},
          {"steps_per_s_slowest_rank", *std::min_element(rates.begin(), rates.end())},
          {"samples_per_s_total", result.samples_per_s * world}};
}

std::string describe_data_parallel(const nlohmann::json& block) {
  char line[160];
  std::snprintf(line, sizeof line,
                "data parallel: %d ranks; per rank %.2f steps/s (slowest rank %.2f), %.1f "
                "samples/s in total",
                block.at("world_size").get<int>(), block.at("steps_per_s_per_gpu").get<double>(),
                block.at("steps_per_s_slowest_rank").get<double>(),
                block.at("samples_per_s_total").get<double>());
  return line;
}

}  // namespace tandem::run
