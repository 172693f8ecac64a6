// Runner: turns a Workload into a Pipeline for one mode and runs it — the only place that knows
// how each mode is built. The run layer (tandem::run), the trainer and the examples are its
// clients.
//
//   mode               lanes and stages (load: the loader and H2D copy, host sources only)
//   serial             load, feeds, train: one lane, one host thread, step after step
//   pipelined          load on "copy", each feed on its lane, train on its lane (high priority),
//                      each stage driven by its own host thread: step n+1's feeds beside step n
//   graphed            load, then one CUDA graph of every feed and the train step, one lane
//   pipelined+graphed  pipelined's lanes; each feed and the train step replay their own graph
//   graphed_k          graphed, K steps per graph (inputs staged into K static slots)
//
// A stage marked Capture::kNever stays eager in every mode (in graphed, the graph is split
// around it). Graphed stages warm up eagerly first (kGraphWarmupSteps), and a batch whose
// shapes differ from the captured ones (a short last batch) runs eagerly; notes() says so.
#pragma once

#include <ATen/core/Generator.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/detail/lane.h"
#include "tandem/detail/stage_timing.h"
#include "tandem/detail/trace.h"
#include "tandem/error.h"
#include "tandem/mode.h"
#include "tandem/workload.h"

namespace tandem {

struct RunOptions {
  Mode mode = Mode::kSerial;  ///< auto is the run layer's (tandem/run/request.h: RunMode)
  int64_t batch_size = 8;     ///< samples per step read from a host data source
  int workers = 4;            ///< loader worker threads (host data sources)
  /// Host batch slots in the loader's ring; 0: ring_slots_for(workers) (loader.h).
  int loader_depth = 0;
  uint64_t seed = 0;  ///< the loader's shuffle
  /// Data parallel: a dataset source is sharded as PyTorch's DistributedSampler shards it
  /// (every world_size-th index of the epoch's order from `rank`), so each rank trains on its
  /// own batch_size samples per step. 0 and 1 for one process.
  int rank = 0, world_size = 1;
  /// Priority of the train lane in the pipelined modes (see LanePriority).
  LanePriority train_priority = LanePriority::kHigh;
  /// Priority of the feed stages' lanes (decode, augment: every stage but the train stage's and
  /// the load's copy lane, which stays normal).
  LanePriority input_priority = LanePriority::kNormal;
  int graph_warmup_steps = kGraphWarmupSteps;  ///< eager steps before a stage captures
  int steps_per_graph = 4;                     ///< graphed_k's K
  /// Sized-to-run sources: 0, every batch full; 1..batch_size-1, the run's last batch has this
  /// many samples (as a dataset whose size is not a multiple of the batch size).
  int64_t last_batch_size = 0;
  /// Host data: a sample that fails to load (a corrupt file) is left out of its batch and
  /// reported by skipped(), instead of stopping the run (LoaderOptions::skip_bad).
  bool skip_bad = false;
  /// If set: the loader's fills and waits, and the stages' intervals (prepare() hands it on).
  Trace* trace = nullptr;
  /// Dataset sources: the global step the run's first step is (a resumed run). The loader
  /// starts where a run from step 0 would be at that step: epoch first_step /
  /// DataSource::batches_per_epoch() of the shuffled order, that many batches into it. Losses and
  /// items still count from 0.
  int64_t first_step = 0;
  /// Keep, for each of the last steps, the state of every generator the workload's stages
  /// register (FeedStage/TrainStage::generators) as it was just before that step's draws:
  /// generator_states_before() reads them (checkpoints of runs that resume exactly).
  bool record_generator_states = false;
  /// If set and nonzero: a step waiting for a batch that a loader worker cannot finish (a file
  /// on a hung mount, say) gives up within about 100 ms, naming the worker's sample, instead
  /// of waiting forever (LoaderOptions::cancel). The Trainer's stop flag.
  const std::atomic<int>* stop = nullptr;
};

/// Runs a stage that failed: what() names the stage, its lane, the step, the mode and the batch
/// size, then the cause (one line).
class RunError : public Error {
 public:
  using Error::Error;
};

/// What a prepared run paid before and beside its steps, host seconds: prepare() (the loader
/// and its workers started, the lanes, the pipeline) and the captures of its graphs (recording
/// and instantiating; the graphed stages' eager warm-up steps are steps and are not counted).
struct RunSetup {
  double prepare_seconds = 0;
  double capture_seconds = 0;
  int graphs = 0;       ///< graphs captured in this run
  int graphs_kept = 0;  ///< graphs an earlier run captured, replayed in this one
};

class Runner {
 public:
  /// Validates the workload and the options (InvalidArgument naming the first problem, e.g. a
  /// graphed mode whose train stage's optimizer is not capturable) and keeps a copy of both.
  Runner(const Workload& workload, RunOptions options);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// A pipeline for `num_steps` steps: a new loader and lanes, its trace RunOptions::trace. The
  /// CUDA graphs an earlier run of this Runner captured are kept, with the loss log they append
  /// to (up to 65 536 steps a run; a longer run captures anew), so a later run replays them from
  /// its first step; a run that failed keeps nothing. They stay valid while what they read
  /// stays where it was: the same parameter, buffer and optimizer-state tensors (updated in
  /// place) and the same step. Set its timing (set_timing) before run().
  void prepare(int64_t num_steps);
  /// The global step of the next prepared run's first step (RunOptions::first_step), for a run
  /// that continues the last one: the data order and resident batches go on from there.
  /// InvalidArgument as the constructor's checks.
  void set_first_step(int64_t first_step);
  /// The trace of the next prepared run (RunOptions::trace); nullptr: none.
  void set_trace(Trace* trace);
  /// The stop flag of the next prepared run (RunOptions::stop); nullptr: none.
  void set_stop(const std::atomic<int>* stop);
  /// Called by each stage's host thread as it starts step `step` (0-based within the run) of
  /// stage `stage` (0 .. num_stages() - 1, the train stage last), before its work is enqueued.
  /// An exception it throws stops the run as the stage's own failure would.
  using StepHook = std::function<void(int stage, int64_t step)>;
  /// Runs the prepared steps; a stage's failure stops every stage and is re-thrown as RunError.
  void run(const StepHook& on_step = {});
  /// prepare(num_steps), run(): trains `num_steps` steps and returns their losses.
  std::vector<float> train(int64_t num_steps);

  // The prepared pipeline's shape, for a front end that times or hooks its steps.
  /// Its stages: the load (host sources), the feeds, the train stage last.
  int num_stages() const;
  /// The stage at which a step's own work begins: 0 where the stages run one after another on
  /// one thread (serial, graphed, graphed_k), the train stage where each stage has a thread of
  /// its own and the stages ahead of it work on later steps (pipelined modes). A clock started
  /// there times exactly the steps that remain.
  int step_start_stage() const;
  /// The lane the train stage runs on in this mode: where work placed between two steps (a
  /// learning rate set, an evaluation) is ordered against them.
  const Lane& train_lane() const;
  /// How many steps the stages ahead of the train stage may run ahead of it.
  int depth() const;
  /// Times the steps >= first_timed_step of the prepared run: host time for each, device time
  /// (CUDA events) on one in every `device_timing_every` (each while a trace is recorded).
  void set_timing(int64_t first_timed_step, int64_t device_timing_every = 1);
  /// The last run's timing per stage (synchronizes with the timing events).
  StageTiming timing() const;

  /// Holds (true) or lets go (false) the loader's workers of a host data source, from any
  /// thread while run() runs: an evaluation between two steps then has the cores its own loader
  /// decodes on, and the training's ring does not fill behind it (which would both slow the
  /// evaluation and flatter the next epoch's rate). Batches already filled stay; a step that
  /// needs one not yet filled waits for the release. No effect on device-resident sources.
  void pause_loading(bool paused);

  /// The last prepared run's setup so far (RunSetup); its captures once run() has returned.
  RunSetup setup() const;
  /// The per-step losses of the last run, in step order (synchronizes).
  std::vector<float> losses() const;
  /// The samples the last run left out (RunOptions::skip_bad), each with why.
  std::vector<SkippedSample> skipped() const;
  /// What the last run did that a reader should know: what was captured into graphs, what ran
  /// eagerly and why.
  std::vector<std::string> notes() const;

  /// The workload's registered generators, feeds' first then the train stage's, in order.
  std::vector<at::Generator> generators() const;
  /// With RunOptions::record_generator_states: the state (at::Generator::get_state) of each of
  /// generators() just before item `item` of the current run drew from it — for a stage that has
  /// not started that item yet, its current state, which is the same. Call it from the
  /// pipeline's hook of the last stage for `item` (run()'s on_item), when every earlier stage
  /// has started the item and the last has not. Throws if the item is no longer kept.
  std::vector<at::Tensor> generator_states_before(int64_t item) const;

  const Workload& workload() const { return workload_; }
  const RunOptions& options() const { return options_; }
  Mode mode() const { return options_.mode; }

 private:
  struct Impl;
  Workload workload_;
  RunOptions options_;
  std::unique_ptr<Impl> impl_;
};

/// The note a graphed mode leaves when it ran on the CPU, where there are no CUDA graphs.
std::string cpu_graph_note(Mode mode);

}  // namespace tandem
