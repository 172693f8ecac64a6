// join_data_parallel and friends (data_parallel.h).
#include "data_parallel.h"

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <thread>

#include "tandem/dist/data_parallel.h"
#include "tandem/dist/launch_env.h"
#include "tandem/dist/launcher.h"
#include "tandem/lane.h"
#include "tandem/mode.h"

namespace tandem {

std::optional<int> launch_if_asked(int nproc, int argc, char** argv) {
  if (nproc <= 0) return std::nullopt;
  if (dist::launch_env_from_environment())
    throw InvalidArgument(detail::concat(
        "--nproc ", nproc, " under a launcher that already set RANK/WORLD_SIZE: drop --nproc "
        "(torchrun starts the ranks) or run without torchrun"));
  std::vector<std::string> args(argv, argv + argc);
  return dist::run_local_ranks(nproc, dist::without_flag(args, "--nproc"));
}

int default_loader_workers(c10::Device device) {
  if (!device.is_cuda()) return 2;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::optional<dist::LaunchEnv> env = dist::launch_env_from_environment();
  const int local_ranks = env ? std::max(1, env->local_world_size) : 1;
  return std::max(1, std::min(15, (cores - 1) / local_ranks));
}

std::shared_ptr<dist::ProcessGroup> join_data_parallel(const std::string& device_flag) {
  const std::optional<dist::LaunchEnv> env = dist::launch_env_from_environment();
  if (!env || env->world_size == 1) return nullptr;
  c10::Device device(c10::kCPU);
  if (device_flag != "cpu") {
    const int gpus = c10::cuda::device_count();
    if (device_flag.rfind("cuda:", 0) == 0)
      throw dist::EnvironmentError(detail::concat(
          "--device ", device_flag, " under data parallel: each rank uses cuda:LOCAL_RANK; "
          "expected --device cuda (or auto)"));
    if (gpus > 0) {
      if (env->local_world_size > gpus || env->local_rank >= gpus)
        throw dist::EnvironmentError(detail::concat(
            "LOCAL_WORLD_SIZE=", env->local_world_size, " ranks on this machine but ", gpus,
            " GPU(s): expected at most one rank per GPU (or --device cpu)"));
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
      c10::cuda::set_device(device.index());
    } else if (device_flag == "cuda") {
      throw InvalidArgument("--device cuda: no CUDA device is available");
    }
  }
  return dist::ProcessGroup::connect(*env, device);
}

void apply_data_parallel(BenchOptions& options, const std::shared_ptr<dist::ProcessGroup>& group,
                         const dist::DataParallelOptions& data_parallel) {
  if (!group) return;
  TANDEM_CHECK_ARG(options.mode != Mode::kAuto,
                   "mode auto under data parallel: its trials are timed by each process, and "
                   "ranks could pick different modes; expected a mode (tandem sweep or a "
                   "one-process auto run tells the best)");
  options.device = group->device().str();
  options.rank = group->rank();
  options.world_size = group->world_size();
  options.progress = options.progress && group->rank() == 0;
  options.gpu_monitor = options.gpu_monitor && group->rank() == 0;
  options.prepare_workload = [group, data_parallel](Workload& w) {
    dist::make_data_parallel(w, group, data_parallel);
  };
}

}  // namespace tandem
