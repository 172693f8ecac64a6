// launch_if_asked (data_parallel.h).
#include "data_parallel.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "tandem/distributed/launch_env.h"
#include "tandem/distributed/launcher.h"
#include "tandem/distributed/process_group.h"

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

void TimeoutFlags::add(CLI::App* app) {
  const distributed::ProcessGroupOptions defaults;
  auto positive = CLI::Validator(
      [](std::string& value) {
        char* end = nullptr;
        const double s = std::strtod(value.c_str(), &end);
        return end != value.c_str() && *end == '\0' && s > 0 && s <= 1e7
                   ? std::string()
                   : value + " is not valid: expected a number of seconds > 0";
      },
      "SECONDS > 0");
  app->add_option("--join-timeout", join_s,
                  detail::concat("data parallel: seconds a rank waits for the others to join "
                                 "(and to leave at the end) [default: ",
                                 defaults.join_timeout.count(), ", or TANDEM_JOIN_TIMEOUT]"))
      ->check(positive);
  app->add_option("--heartbeat-timeout", heartbeat_s,
                  detail::concat("data parallel: a rank silent this many seconds is declared "
                                 "dead and every rank stops [default: ",
                                 defaults.dead_after_s,
                                 ", or TANDEM_HEARTBEAT_TIMEOUT]; across "
                                 "machines, raise it above the network's hiccups"))
      ->check(positive);
}

distributed::ProcessGroupOptions TimeoutFlags::options() const {
  return distributed::options_with_timeouts(join_s, heartbeat_s);
}

}  // namespace tandem
