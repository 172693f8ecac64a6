// ProcessGroup: the ranks of a data-parallel job, connected. A rendezvous store (c10d's
// TCPStore: hosted by rank 0, or by torchrun's agent) carries the join, host-side reductions of
// losses and metrics, and every rank's heartbeat; the device collectives that average gradients
// run over NCCL on CUDA, and over the store on the CPU (no gloo headers ship with the wheel; the
// store path is honest, deterministic and slow: for tests and CPU runs of small models).
//
// A dead rank never hangs the others: each rank's watchdog thread beats every second and reads
// the others' beats; a rank silent for ProcessGroupOptions::dead_after_s, or a store that stops
// answering (rank 0 or the agent gone), ends the process with exit code 1 and one line naming
// the rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/launch_env.h"

namespace tandem::distributed {

struct ProcessGroupOptions {
  /// How long a rank waits for the others to join (and to leave, in finish()).
  std::chrono::seconds join_timeout{120};
  /// How long a host collective (all_reduce_host, barrier, the CPU's device collectives) waits
  /// for the other ranks: long, because a rank may be busy for minutes between two of them
  /// (rank 0 evaluating a large validation set while the others wait). A dead rank is found by
  /// the heartbeat much sooner.
  std::chrono::seconds collective_timeout{1800};
  /// A rank whose heartbeat stops for this long is declared dead.
  double dead_after_s = 10.0;
  /// Device collectives over the store even on CUDA (tests); default: NCCL on CUDA.
  bool force_store_collectives = false;
};

/// The options with the timeouts the environment sets, for any launcher (seconds, > 0):
/// TANDEM_JOIN_TIMEOUT (join_timeout), TANDEM_HEARTBEAT_TIMEOUT (dead_after_s),
/// TANDEM_COLLECTIVE_TIMEOUT (collective_timeout); unset: `defaults`'. EnvironmentError naming a
/// variable that is not a positive number.
ProcessGroupOptions options_from_environment(ProcessGroupOptions defaults = {});

/// options_from_environment(), then the timeouts a front end was given, in seconds (its flags,
/// tandem.distributed.set_timeouts; 0: not given): join_timeout (rounded up to whole seconds)
/// and dead_after_s.
ProcessGroupOptions options_with_timeouts(double join_s, double heartbeat_s);

class ProcessGroup {
 public:
  /// Connects this process to the job `env` describes and waits until every rank has joined.
  /// `device` is this rank's device (cuda:LOCAL_RANK, or the CPU). Throws EnvironmentError (exit
  /// 2) for a port in use, a store that cannot be reached, ranks started with different world
  /// sizes, more processes than WORLD_SIZE; tandem::Error when the others do not join in time.
  static std::shared_ptr<ProcessGroup> connect(const LaunchEnv& env, c10::Device device,
                                               ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  c10::Device device() const;
  const LaunchEnv& env() const;
  /// Which attempt of the job this is, the same on every rank: under torchrun's agent store, 2
  /// and up after the elastic agent restarted the workers (--max-restarts), however each node
  /// counts its restarts; 1 otherwise.
  int attempt() const;
  /// Whether this attempt follows a failed one: torchrun restarted the workers.
  bool restarted() const { return attempt() > 1 || env().restart > 0; }
  /// "NCCL 2.28.9" or "store (CPU)".
  std::string backend() const;

  /// Replaces each tensor by its mean over the ranks, in place, as one group of collectives on
  /// the current stream (NCCL; capture-safe) or synchronously (store: summed in rank order, so
  /// every rank gets bitwise the same result). Every rank must call it with the same shapes and
  /// dtypes in the same order. Tensors must be dense (any layout whose memory is contiguous).
  void all_reduce_mean_(const std::vector<at::Tensor>& tensors);
  /// Overwrites each tensor with rank `root`'s, in place (same contract as all_reduce_mean_).
  void broadcast_(const std::vector<at::Tensor>& tensors, int root = 0);
  /// Every rank's inputs[i], concatenated along dim 0 in rank order, written into outputs[i]
  /// (its dim 0 world_size() times inputs[i]'s, the rest of its shape, dtype and device the
  /// same; contiguous): on the current stream (NCCL, grouped, capture-safe) or synchronously
  /// (store). Every rank calls it with the same shapes in the same order, as all_reduce_mean_.
  void all_gather_(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);
  /// Host values reduced over the ranks (through the store): the mean, sum or max of each
  /// element, the same on every rank. For losses and metrics, not for the hot path.
  enum class HostOp { kMean, kSum, kMax };
  std::vector<double> all_reduce_host(const std::vector<double>& values, HostOp op = HostOp::kMean);
  /// Every rank's `bytes`, in rank order, on every rank (through the store): small host data,
  /// such as generator states for a checkpoint.
  std::vector<std::vector<uint8_t>> all_gather_host(const std::vector<uint8_t>& bytes);
  /// Every rank reaches this point before any leaves it (through the store).
  void barrier();
  /// Leaves the job cleanly: marks this rank done (its watchdog's silence is then no death),
  /// waits for the others and stops the watchdog; rank 0 keeps its store up until every rank has
  /// left. The destructor calls it; call it yourself to see its errors.
  void finish();

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::distributed
