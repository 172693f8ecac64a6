// The CLI's side of data parallel: join the job the environment describes (torchrun, or the
// ranks `--nproc N` starts), pick this rank's device, and hand bench its rank and the step that
// makes each workload instance data parallel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/bench.h"
#include "tandem/dist/data_parallel.h"
#include "tandem/dist/process_group.h"

namespace tandem {

/// With `nproc` > 0 and no launch around this process: runs `argv` as that many local ranks
/// (dist::run_local_ranks, argv without --nproc) and returns their exit code; else nullopt (go
/// on in this process). Under a launcher already (RANK set) --nproc is refused: InvalidArgument.
std::optional<int> launch_if_asked(int nproc, int argc, char** argv);

/// Joins the job when the environment describes one of more than one rank, else nullptr.
/// `device_flag` (auto, cpu, cuda, cuda:N) picks this rank's device: cuda:LOCAL_RANK unless the
/// CPU is asked for or there is no GPU. Throws dist::EnvironmentError (exit 2) for more local
/// ranks than GPUs or an explicit cuda:N.
std::shared_ptr<dist::ProcessGroup> join_data_parallel(const std::string& device_flag);

/// Loader threads for a process training on `device` when the user gives no count: on a GPU
/// the machine's cores less one (at most 15), shared by the LOCAL_WORLD_SIZE ranks of this
/// machine when a launch describes them (two ranks on 16 cores: 7 each, not 15 each fighting for
/// the same cores); 2 on the CPU.
int default_loader_workers(c10::Device device);

/// Makes `options` run as this rank of `group`: device, rank, world size, data parallel
/// workloads, progress on rank 0 only. Refuses mode auto (its trials are timed per process, and
/// ranks could pick different modes): InvalidArgument.
void apply_data_parallel(BenchOptions& options, const std::shared_ptr<dist::ProcessGroup>& group,
                         const dist::DataParallelOptions& data_parallel = {});

}  // namespace tandem
