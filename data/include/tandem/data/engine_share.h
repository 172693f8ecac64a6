// Which of a run's samples the GPU's JPEG engines decode rather than the CPU workers, by the
// loader's draw position, and the rates both sides measure as the run goes (engine_split.h puts
// it to work).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/detail/thread_sched.h"

namespace tandem::data {

/// What a sample at a draw position costs the CPU workers to decode, in any unit that orders
/// the positions: a pure function of the position (engines_take_costliest ranks by it).
using CpuCostKey = std::function<double(uint64_t position)>;

/// The positions a block of kEngineBlock consecutive draw positions gives the engines: as many
/// as decodes_on_engines(share, ·) picks in the block (so round(share * 1024) of every 1024, and
/// a batch's count as steady), taken by the positions whose `cpu_cost` is highest (ties: the
/// earlier position). The engines decode a whole image whatever its crop, while the workers'
/// cost varies by several times from sample to sample, so leaving the workers the cheap ones
/// raises the samples they supply a second at the same share. A pure function of the share, the
/// position and the cost key.
bool engines_take_costliest(double share, uint64_t position, const CpuCostKey& cpu_cost);
constexpr uint64_t kEngineBlock = 64;

/// The engines' first share from a trial: the one at which both sides take the same time for
/// their parts of a batch, (1 - s) / cpu(s) = s / engines, where the workers keep the crops
/// engines_take_costliest leaves them, so their rate grows with the share. cpu(s) is the trial's
/// `cpu_rate` (every crop) times the mean of `seconds_per_file` over the mean of the files the
/// workers would keep at s (file i drawn at position i; a time <= 0: not timed, left out); a few
/// rounds of that fixed point from engines / (engines + cpu_rate). Without a cost key, or with
/// no timed file, engines / (engines + cpu_rate).
double first_balanced_share(double engine_rate, double cpu_rate,
                            const std::vector<double>& seconds_per_file,
                            const CpuCostKey& cpu_cost);

/// The JPEG engines' share of a run's samples, by the loader's draw position, and the rates
/// both sides measured. Thread-safe: the loader's workers ask on_engines() and record_cpu(), the
/// feed stage records the engines' batches and rebalances.
///
/// A change of share takes effect from the first position no worker has asked about yet, so a
/// position's side never changes once asked, and schedule() says which side every position
/// took: a run that restores it splits its positions alike (on_engines is then a pure function
/// of the position again).
class EngineShare {
 public:
  /// From position 0 on, `share` (0..1) of every 1024 positions on the engines
  /// (decodes_on_engines). `adaptive`: rebalance() may move it.
  explicit EngineShare(double share, bool adaptive = false);

  /// Whether the sample at `position` goes to the engines (and notes the position as asked):
  /// decodes_on_engines with the share in force there, or engines_take_costliest where the
  /// caller gives its samples' cost key.
  bool on_engines(uint64_t position, const CpuCostKey& cpu_cost = {});
  /// The share in force for the positions not yet asked about.
  double share() const;
  bool adaptive() const { return adaptive_; }

  /// One share, from a position on.
  struct Change {
    uint64_t from_position = 0;
    double share = 0;
  };
  /// Every share the run has used, in order; the first is from position 0.
  std::vector<Change> schedule() const;
  /// Replaces the schedule (a resumed run's, or one share from the start); InvalidArgument
  /// unless it starts at position 0, its positions rise and each share is within 0..1.
  void restore(const std::vector<Change>& schedule);

  /// `share` (0..1, InvalidArgument outside) from the first position no worker has asked about
  /// on: an evaluation turns the engines on for the positions its ring has not decoded ahead,
  /// and off again after it, since the workers can decode ahead and the engines cannot.
  void set(double share);

  /// A worker spent `seconds` of its own time on samples, `samples` of which it decoded (0 for
  /// one it left to the engines: its read still takes the worker's time); `used`: the worker
  /// thread's use of a core in those seconds (this_thread_usage's difference), zeros if not
  /// measured.
  void record_cpu(int64_t samples, double seconds, const ThreadUsage& used = {});
  /// The feed stage decoded `samples` on the engines in `decode_seconds`, its thread using a
  /// core as `used` says in them. The first kEngineWarmupCalls calls, which set the engines'
  /// buffers up, are not counted.
  void record_engines(int64_t samples, double decode_seconds, const ThreadUsage& used = {});
  static constexpr int kEngineWarmupCalls = 2;

  /// The rates measured in the window so far: the workers' combined rate (the samples they
  /// decoded over their time on every sample, times `workers` at once) and the engines'; 0
  /// where a side has decoded nothing.
  /// And how much of a core each side's threads had: the CPU time of the workers over their
  /// time on the samples, and of the engines' feed thread over its decode time (it spins on
  /// the GPU's events in its waits, so below ~1 it lost its core for part of them), and their
  /// involuntary switches (the scheduler taking the core away) per second of that time. A
  /// starved thread shows as a low fraction with many switches; 0 where not measured.
  struct Rates {
    double cpu_images_per_s = 0, engine_images_per_s = 0;
    int64_t cpu_samples = 0, engine_samples = 0;
    double workers_on_core = 0, engines_thread_on_core = 0;
    double worker_preemptions_per_s = 0, engines_thread_preemptions_per_s = 0;
  };
  Rates rates(int workers) const;

  /// Adaptive only: once both sides have measured a window (kWindowBatches engine calls, and
  /// as many half batches of regions), moves the share half way to the one at which both sides
  /// decode their parts of a batch in the same time, (1 - s) / cpu = s / engines, when that
  /// moves it by at least 1/128, and starts the next window. Returns whether it changed.
  bool rebalance(int workers, int64_t batch_size);
  static constexpr int kWindowBatches = 4;

  /// "the JPEG engines decode S of each batch, the CPU workers the rest" plus, where measured,
  /// both sides' rates and how the share moved.
  std::string report(int workers) const;

 private:
  mutable std::mutex mu_;
  bool adaptive_;
  std::vector<Change> schedule_;
  uint64_t next_unasked_ = 0;  // one past the highest position asked about
  // In the window so far:
  int64_t cpu_samples_ = 0, engine_samples_ = 0, engine_calls_ = 0;
  int64_t warmup_calls_left_ = kEngineWarmupCalls;
  double cpu_seconds_ = 0, engine_seconds_ = 0;
  ThreadUsage cpu_used_, engine_used_;  // the threads' use of the cores in those seconds
  // The rates that set the last change (for report()).
  Rates last_rates_;
};

}  // namespace tandem::data
