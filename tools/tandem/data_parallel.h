// The CLI's side of data parallel: `--nproc N` starts the ranks itself. Joining the job and
// running as a rank are the run layer's (tandem/run/data_parallel.h), shared with Python.
#pragma once

#include <optional>

#include "tandem/run/data_parallel.h"

namespace tandem {

/// With `nproc` > 0 and no launch around this process: runs `argv` as that many local ranks
/// (distributed::run_local_ranks, argv without --nproc) and returns their exit code; else nullopt
/// (go on in this process). Under a launcher already (RANK set) --nproc is refused:
/// InvalidArgument.
std::optional<int> launch_if_asked(int nproc, int argc, char** argv);

}  // namespace tandem
