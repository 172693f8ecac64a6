// Reads and checks torchrun's environment contract (launch_env.h).
#include "tandem/distributed/launch_env.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

namespace tandem::distributed {

namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

/// The integer value of `name`, or `fallback` when unset; EnvironmentError when it is set but
/// not an integer, or when it is unset and there is no fallback.
int integer(const char* name, std::optional<int> fallback, const char* what) {
  const char* v = get(name);
  if (!v) {
    if (fallback) return *fallback;
    throw EnvironmentError(detail::concat(
        name,
        " is not set: a data-parallel launch (torchrun, or tandem --nproc N) sets RANK, "
        "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; expected ",
        what));
  }
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < -1000000 || x > 1000000)
    throw EnvironmentError(detail::concat(name, "='", v, "' is not valid: expected ", what));
  return static_cast<int>(x);
}

}  // namespace

std::string LaunchEnv::describe() const {
  return detail::concat("rank ", rank, "/", world_size, " (local ", local_rank, "/",
                        local_world_size, "), store ", master_addr, ":", master_port,
                        agent_store ? " hosted by torchrun's agent" : " hosted by rank 0");
}

std::string rank_prefix(int rank, int world_size) {
  return world_size > 1 ? detail::concat("[rank ", rank, "] ") : std::string();
}

std::string rank_prefix() {
  const char* rank = get("RANK");
  const char* world = get("WORLD_SIZE");
  return rank && world ? rank_prefix(std::atoi(rank), std::atoi(world)) : std::string();
}

std::optional<LaunchEnv> launch_env_from_environment() {
  if (!get("RANK") && !get("WORLD_SIZE") && !get("LOCAL_RANK")) return std::nullopt;
  LaunchEnv e;
  e.world_size = integer("WORLD_SIZE", std::nullopt, "the number of processes, >= 1");
  if (e.world_size < 1)
    throw EnvironmentError(detail::concat("WORLD_SIZE=", e.world_size,
                                          " is not valid: expected the number of processes, >= 1"));
  e.rank = integer("RANK", std::nullopt, "this process's rank, 0 .. WORLD_SIZE-1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw EnvironmentError(detail::concat("RANK=", e.rank, " is not valid for WORLD_SIZE=",
                                          e.world_size, ": expected 0 .. ", e.world_size - 1));
  e.local_world_size =
      integer("LOCAL_WORLD_SIZE", e.world_size, "the number of processes on this machine, >= 1");
  e.local_rank = integer("LOCAL_RANK", e.rank, "this process's rank on its machine");
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    throw EnvironmentError(
        detail::concat("LOCAL_WORLD_SIZE=", e.local_world_size,
                       " is not valid: expected 1 .. WORLD_SIZE=", e.world_size));
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size)
    throw EnvironmentError(detail::concat(
        "LOCAL_RANK=", e.local_rank,
        " is not valid: expected 0 .. LOCAL_WORLD_SIZE-1 = ", e.local_world_size - 1));
  const char* addr = get("MASTER_ADDR");
  if (!addr)
    throw EnvironmentError(
        "MASTER_ADDR is not set: expected the host name or address of rank 0 (or of torchrun's "
        "rendezvous endpoint), e.g. MASTER_ADDR=127.0.0.1 on one machine");
  e.master_addr = addr;
  e.master_port = integer("MASTER_PORT", std::nullopt, "a TCP port, 1 .. 65535");
  if (e.master_port < 1 || e.master_port > 65535)
    throw EnvironmentError(detail::concat("MASTER_PORT=", e.master_port,
                                          " is not valid: expected a TCP port, 1 .. 65535"));
  const char* agent = get("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && (std::string(agent) == "True" || std::string(agent) == "true" ||
                            std::string(agent) == "1");
  e.restart = integer("TORCHELASTIC_RESTART_COUNT", 0, "a restart count, >= 0");
  return e;
}

int default_loader_workers(const c10::Device& device, int most) {
  if (!device.is_cuda()) return 2;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::optional<LaunchEnv> env = launch_env_from_environment();
  const int local_ranks = env ? std::max(1, env->local_world_size) : 1;
  return std::max(1, std::min(most, (cores - 1) / local_ranks));
}

}  // namespace tandem::distributed
