// launch_if_asked (data_parallel.h).
#include "data_parallel.h"

#include <string>
#include <vector>

#include "tandem/distributed/launch_env.h"
#include "tandem/distributed/launcher.h"

namespace tandem {

std::optional<int> launch_if_asked(int nproc, int argc, char** argv) {
  if (nproc <= 0) return std::nullopt;
  if (distributed::launch_env_from_environment())
    throw InvalidArgument(
        detail::concat("--nproc ", nproc,
                       " under a launcher that already set RANK/WORLD_SIZE: drop --nproc "
                       "(torchrun starts the ranks) or run without torchrun"));
  std::vector<std::string> args(argv, argv + argc);
  return distributed::run_local_ranks(nproc, distributed::without_flag(args, "--nproc"));
}

}  // namespace tandem
