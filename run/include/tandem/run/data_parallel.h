// A run as one rank of a data-parallel job, for every front end (the CLI's bench and train,
// tandem.Trainer in Python): join the job the environment describes (torchrun, or the ranks
// `tandem --nproc N` starts), pick this rank's device, hand run_workload its rank and the hook
// that makes each workload instance data parallel, agree on mode auto's pick, and reduce the
// report over the ranks.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/distributed/data_parallel.h"
#include "tandem/distributed/process_group.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/run/run_workload.h"

namespace tandem::run {

/// Joins the job when the environment describes one of more than one rank, else nullptr.
/// `device_flag` (auto, cpu, cuda, cuda:N) picks this rank's device: cuda:LOCAL_RANK unless the
/// CPU is asked for or there is no GPU. Throws distributed::EnvironmentError (exit 2) for more
/// local ranks than GPUs or an explicit cuda:N.
/// `options`: the group's timeouts (the environment's, distributed::options_from_environment,
/// unless the front end's flags say otherwise).
std::shared_ptr<distributed::ProcessGroup> join_data_parallel(
    const std::string& device_flag,
    const distributed::ProcessGroupOptions& options = distributed::options_from_environment());

/// Makes `request` run as this rank of `group`: device, rank, world size, progress and GPU
/// monitor on rank 0 only, and the hook that makes each instance data parallel. No group:
/// nothing. Mode auto then resolves through resolve_mode_as_rank.
void apply_data_parallel(RunRequest& request, RunHooks& hooks,
                         const std::shared_ptr<distributed::ProcessGroup>& group,
                         const distributed::DataParallelOptions& data_parallel = {});

/// Rank 0's `value` on every rank of `group` (through the store; a collective: every rank
/// calls it). How the ranks agree on a choice each could make differently, such as mode auto's.
double value_of_rank0(distributed::ProcessGroup& group, double value);

/// resolve_mode as this rank of `group` (request and hooks from apply_data_parallel): for mode
/// auto every rank times the modes alone, without communication (a trial's step count follows
/// its own rate, so ranks could not keep their collectives in step), then all take rank 0's pick
/// (the decision and trials returned are this rank's, the mode rank 0's). A collective for mode
/// auto: every rank calls it.
ModeResolution resolve_mode_as_rank(const RunRequest& request, const RunHooks& hooks,
                                    distributed::ProcessGroup& group);

/// resolve_mode_as_rank, then the run of its mode, data parallel. A collective.
AutoReport run_auto_as_rank(const RunRequest& request, const RunHooks& hooks,
                            distributed::ProcessGroup& group);

/// After a run of every rank: replaces `result`'s losses by their mean over the ranks (the
/// global batch's loss, the same on every rank) and returns what the report adds under
/// "data_parallel" — world size, backend, this rank's and every rank's steps/s, the slowest
/// rank's, samples/s in total. A collective: every rank calls it once per run.
nlohmann::json reduce_over_ranks(RunReport& result, distributed::ProcessGroup& group);

/// One line for a terminal: "data parallel: W ranks; per rank ... steps/s (slowest rank ...),
/// ... samples/s in total", from reduce_over_ranks' block.
std::string describe_data_parallel(const nlohmann::json& block);

}  // namespace tandem::run
