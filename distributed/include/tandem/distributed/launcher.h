// The local launcher behind `tandem … --nproc N`: starts N copies of this program as ranks
// 0..N-1 under torchrun's environment contract (launch_env.h) on a free loopback port, and
// supervises them like torchrun: when a rank fails, the others are stopped, and the launcher
// exits with the failed rank's code.
#pragma once

#include <string>
#include <vector>

namespace tandem::distributed {

/// Runs `argv` (argv[0] is ignored: this executable, /proc/self/exe, runs) as `nproc` local
/// ranks and waits for them. SIGINT/SIGTERM to the launcher go to every rank. Returns 0 when
/// every rank exits 0; else the first failure's exit code (128 + signal for a killed rank),
/// after one line naming the rank and stopping the others (SIGTERM, then SIGKILL after 10 s).
/// Throws InvalidArgument for nproc < 1.
int run_local_ranks(int nproc, const std::vector<std::string>& argv);

/// argv without the flag `flag` and its value ("--nproc 2" or "--nproc=2").
std::vector<std::string> without_flag(const std::vector<std::string>& argv,
                                      const std::string& flag);

}  // namespace tandem::distributed
