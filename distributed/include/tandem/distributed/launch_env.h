// LaunchEnv: where this process sits in a data-parallel job, read from the environment that
// torchrun (and `tandem … --nproc N`, which follows the same contract) sets: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and TORCHELASTIC_USE_AGENT_STORE when
// torchrun's agent already hosts the rendezvous store.
#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "tandem/error.h"

namespace tandem::distributed {

/// The environment of a launch is inconsistent or unusable (a missing MASTER_ADDR, RANK outside
/// WORLD_SIZE, more local ranks than GPUs, a port in use, ranks started with different world
/// sizes). An InvalidArgument: the CLI prints its one line and exits 2.
class EnvironmentError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct LaunchEnv {
  int rank = 0;              ///< RANK: 0 .. world_size-1 over all machines
  int world_size = 1;        ///< WORLD_SIZE
  int local_rank = 0;        ///< LOCAL_RANK: this machine's rank, the GPU index it uses
  int local_world_size = 1;  ///< LOCAL_WORLD_SIZE (torchrun); world_size when unset
  std::string master_addr;   ///< MASTER_ADDR: the rendezvous store's host
  int master_port = 0;       ///< MASTER_PORT
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store, every rank connects to
  /// it as a client (else rank 0 hosts it).
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: keys of a restarted attempt do not mix with the last one's.
  int restart = 0;

  /// "rank 1/2 (local 1), store 127.0.0.1:29500 hosted by rank 0"
  std::string describe() const;
};

/// The launch this process is part of, or nullopt when none of RANK, WORLD_SIZE, LOCAL_RANK is
/// set (one process, no data parallelism). Throws EnvironmentError naming the variable and what
/// was expected when the variables are set but inconsistent: a missing or non-numeric one,
/// RANK outside [0, WORLD_SIZE), LOCAL_RANK outside [0, LOCAL_WORLD_SIZE), a port outside
/// 1..65535.
std::optional<LaunchEnv> launch_env_from_environment();

/// Loader threads for a process training on `device` when the user gives no count — the one
/// rule of every front end (`tandem bench`, `tandem train`, `tandem data-bench`,
/// tandem.Trainer, tandem::train's Trainer and jobs): on a GPU the machine's cores less one (at
/// most `most`), shared by the LOCAL_WORLD_SIZE ranks of this machine when a launch describes
/// them (two ranks on 16 cores: 7 each, not 15 each fighting for the same cores); 2 on the CPU.
/// Why so many on a GPU: a loader that decodes photos is bound by its cores (ResNet-50 from
/// 1000–2000 px JPEGs on 15 cores), and idle workers cost nothing. Here because the launch is
/// what divides the cores, and both the run layer and the train layer see this library.
int default_loader_workers(const c10::Device& device, int most = 15);

/// "[rank 1] " for rank 1 of a job of more than one rank, else "": the prefix of a rank's log and
/// error lines, so a job's output says which rank spoke.
std::string rank_prefix(int rank, int world_size);
/// rank_prefix() of this process, from RANK and WORLD_SIZE as a launcher set them ("" when they
/// are unset or not numbers; never throws: error paths call it).
std::string rank_prefix();

}  // namespace tandem::distributed
