// The CLI's side of data parallel: `--nproc N` starts the ranks itself. Joining the job and
// running as a rank are the run layer's (tandem/run/data_parallel.h), shared with Python.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

#include "tandem/run/data_parallel.h"

namespace tandem {

/// The data-parallel job's timeouts as a subcommand's flags (bench, train): --join-timeout and
/// --heartbeat-timeout, over the environment's (TANDEM_JOIN_TIMEOUT, TANDEM_HEARTBEAT_TIMEOUT:
/// any launcher) and the built-in defaults.
struct TimeoutFlags {
  double join_s = 0, heartbeat_s = 0;  // 0: not given
  void add(CLI::App* app);
  /// The group's options: a flag given, else its environment variable, else the default.
  distributed::ProcessGroupOptions options() const;
};

/// With `nproc` > 0 and no launch around this process: runs `argv` as that many local ranks
/// (distributed::run_local_ranks, argv without --nproc) and returns their exit code; else nullopt
/// (go on in this process). Under a launcher already (RANK set) --nproc is refused:
/// InvalidArgument.
std::optional<int> launch_if_asked(int nproc, int argc, char** argv);

}  // namespace tandem
