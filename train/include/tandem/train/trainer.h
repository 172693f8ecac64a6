// Trainer: a training run over epochs on top of the Runner — the learning-rate schedule, an
// evaluation after each epoch, metrics files, atomic checkpoints, an exact resume, and a clean
// stop on SIGINT/SIGTERM. It works in every mode: the run is one Runner pass over all the
// epochs' steps (one loader, graphs captured once), and everything between steps happens in
// the pipeline's hook of the train stage, on the train lane, between step n-1 and step n:
//
//   train lane: ..[step n-1]──[set_lr(g)][eval?][checkpoint?]──[step n]..
//   feed lanes: ..[feeds n+1][feeds n+2]..  (they run ahead, reading no trained weight)
//
// Feed stages must not read weights the train stage updates (a frozen backbone is fine).
// Without a run folder the same loop trains a count of steps back to back, writing nothing
// (every tandem.Trainer fit runs it, with a folder or without).
#pragma once

#include <torch/nn/module.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/detail/lane.h"
#include "tandem/detail/stage_timing.h"
#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/mode.h"
#include "tandem/models/safetensors.h"
#include "tandem/optim.h"
#include "tandem/runner.h"  // RunSetup
#include "tandem/workload.h"

namespace tandem {
class Trace;
}
namespace tandem::distributed {
class ProcessGroup;
}

namespace tandem::train {

struct Checkpoint;  // checkpoint.h

/// Metrics by name ("accuracy", "loss", ...), as an evaluation returns them.
using Metrics = std::map<std::string, double>;

/// What an evaluation returns: its metrics and how many samples it scored (for its img/s; 0:
/// not said, and no rate is reported). A Metrics converts to it, so an evaluation may return
/// just its metrics.
struct Evaluation {
  Evaluation() = default;
  Evaluation(Metrics m, int64_t samples_scored = 0)  // NOLINT: implicit from Metrics on purpose
      : metrics(std::move(m)), samples(samples_scored) {}
  Metrics metrics;
  int64_t samples = 0;
};

/// The weights a run saves (checkpoints, the final model.safetensors) and a resume loads, under
/// their state_dict keys, for a model that is not a LibTorch module (Python's tandem.Trainer
/// gives its torch.nn.Module's this way). Both are called between steps, on the train lane.
struct ModelWeights {
  std::function<models::NamedTensors()> state_dict;
  /// Copies `tensors` into the model (strictly: every key, no other); throws naming a mismatch.
  std::function<void(const models::NamedTensors& tensors)> load_state_dict;
  explicit operator bool() const { return state_dict && load_state_dict; }
};

/// A run's batch size where nothing sets it: TrainOptions' and the job builders'
/// (ClassifierOptions), one default for both. Their loader workers default to 0: every front
/// end's rule for the job's device (distributed::default_loader_workers).
inline constexpr int64_t kDefaultBatchSize = 64;

/// What a Trainer trains: built by make_classifier (classifier.h), or by hand.
struct TrainJob {
  std::string name;  ///< for reports: "small_cnn on fashion-mnist"
  /// The training step over the training set: a dataset source (DataSource::from_dataset,
  /// shuffled, drop_last), its optimizer tandem's Sgd, Adam or AdamW (checkpointable).
  Workload workload;
  /// Every weight the run trains and saves, under its state_dict keys (frozen parts included:
  /// the file is the whole model).
  std::shared_ptr<torch::nn::Module> model;
  /// Instead of `model`, for a model that is not a LibTorch module; empty: the model's own.
  ModelWeights weights;
  /// Evaluates the model on held-out data on `lane` (the train lane, between two steps) and
  /// returns its metrics (the first is the headline: accuracy), and how many samples it scored.
  /// May synchronize. Empty: none.
  std::function<Evaluation(const Lane& lane)> evaluate;
  /// Runs the evaluation's code once on stand-in data (zeros at the batch size), scoring
  /// nothing, on `lane` between two steps of a Trainer's first run, on the thread that
  /// evaluates: CUDA loads a kernel at its first launch, which made the first evaluation several
  /// times slower than the later ones; done while the first steps run on the device, the loading
  /// overlaps them. Must leave every weight, statistic, generator and metric as it found them.
  /// Empty: none.
  std::function<void(const Lane& lane)> prepare_evaluation;
  /// The batch size and worker count the job's own loaders and evaluation were built for
  /// (make_classifier, make_segmenter: ClassifierOptions'); a Trainer refuses options that ask
  /// others, naming both. 0: the job has none of its own (a job built by hand).
  int64_t built_for_batch_size = 0;
  int built_for_workers = 0;
  /// What must match for a resume (model, data, batch size, optimizer...): a checkpoint made
  /// under another configuration is refused, naming both. Its "data" and "val", when they name
  /// folders, are identified by content (fingerprint_data, checkpoint.h), not by the path: the
  /// same files elsewhere resume (said in a note), other files are refused.
  nlohmann::json config;
  /// The job's own state beyond the weights and the optimizer (a decode split's shares), saved
  /// with every checkpoint and given back when a run resumes from one; empty: none.
  std::function<nlohmann::json()> save_state;
  std::function<void(const nlohmann::json&)> load_state;
  /// What the job measured or decided during the run (the evaluation's kept samples), added to
  /// TrainResult::notes at its end; empty function, or empty text: nothing.
  std::function<std::string()> report;
};

struct TrainOptions {
  int64_t epochs = 10;
  /// The run's length in steps instead of epochs (0: `epochs` epochs). Only without a run
  /// folder, whose runs train whole epochs (its records, checkpoints and resume count them).
  int64_t steps = 0;
  int64_t batch_size = kDefaultBatchSize;
  Mode mode = Mode::kPipelinedGraphed;  ///< auto is a front end's to resolve
  /// Loader threads; 0: distributed::default_loader_workers for the job's device (the CLI's and
  /// tandem.Trainer's rule).
  int workers = 0;
  uint64_t seed = 0;
  bool skip_bad = false;
  /// The learning rate of each global step (optim.h's schedules); empty: the optimizer's own.
  optim::LrSchedule schedule;
  /// RUN_DIR: metrics.jsonl, metrics.csv, checkpoints/, model.safetensors (the final weights).
  /// Empty: a run without a folder — nothing written, no checkpoints or resume, and epochs
  /// recorded (TrainResult::epochs) only when the job evaluates; without an evaluation the
  /// steps run back to back with nothing between them but the schedule and a stop's check.
  std::string out_dir;
  /// Without a run folder: the global step this run starts at, continuing an earlier run of the
  /// same job (as successive tandem.Trainer fits do): the data order, the augmentation's draws
  /// and the schedule's step go on from there. A folder's run starts at its checkpoint's step.
  int64_t first_step = 0;
  /// Continue the run in out_dir from its newest valid checkpoint (a damaged newer one is
  /// skipped, saying why), or start it from step 0 when it has none (a run that failed before
  /// its first checkpoint), saying so. Without it an existing, non-empty out_dir is refused
  /// (nothing is overwritten).
  bool resume = false;
  int64_t checkpoint_every = 0;  ///< steps between checkpoints; 0: at each epoch end only
  int keep_checkpoints = 3;
  /// Set (to the signal number) to stop: the step in flight finishes, a checkpoint is written,
  /// and run() returns with TrainResult::stopped_by_signal set. Polled between steps.
  const std::atomic<int>* stop = nullptr;
  /// Called on the train stage's thread about every `progress_seconds`, and at each epoch end.
  struct Progress {
    int64_t epoch = 0, epochs = 0;  ///< 0-based epoch in progress
    int64_t step_in_epoch = 0, steps_per_epoch = 0;
    int64_t step = 0, total_steps = 0;  ///< global steps done
    double loss = 0;                    ///< the latest step's
    double images_per_s = 0;            ///< over this run so far, evaluation excluded
  };
  std::function<void(const Progress&)> on_progress;
  double progress_seconds = 0.5;
  /// Called after each epoch's evaluation, once its record is in metrics.jsonl.
  std::function<void(const struct EpochRecord&)> on_epoch;
  /// Data parallel (tandem::distributed): every rank builds the same job and runs a Trainer with
  /// the same options; batch_size is per rank and each rank trains on its shard. Rank 0 alone
  /// writes the run folder (checkpoints hold every rank's generator states), evaluates and
  /// reports; the ranks agree every kAgreeEvery steps on a stop (a signal on any rank) and on
  /// a non-finite loss, so all stop at one step. Losses are averaged over the ranks; img/s
  /// counts every rank's images. Empty: one process.
  std::shared_ptr<distributed::ProcessGroup> group;
  /// If set: the run's timeline (the loader's fills and waits, the stages' intervals); the
  /// caller writes it.
  Trace* trace = nullptr;
  /// The stages' device time (CUDA events) on one step in every `device_timing_every`, their
  /// host time on every step, into TrainResult::timing; 0: not timed.
  int64_t device_timing_every = 0;
};

/// Data parallel: steps between the ranks' agreements on a stop (a store round trip each).
constexpr int64_t kAgreeEvery = 8;

/// One epoch's record, as written to metrics.jsonl / .csv. An epoch a run was resumed inside is
/// whole all the same: the checkpoint carries the epoch's running sums (losses, steps, seconds,
/// images), so its train_loss is bitwise the uninterrupted run's on the CPU and its
/// train_seconds the sum of both parts; resumed_at_step marks it.
struct EpochRecord {
  int64_t epoch = 0;      ///< 1-based, as people count them
  int64_t step = 0;       ///< global steps done at its end
  double train_loss = 0;  ///< mean over the epoch's steps
  double lr = 0;          ///< the last step's learning rate
  /// Training img/s in the epoch's steady state: from its (pipeline depth + 2)-th step to its
  /// end (the first steps after a boundary find inputs the feeds made during the evaluation).
  double images_per_s = 0;
  double epoch_images_per_s = 0;               ///< the whole epoch's images over train_seconds
  double train_seconds = 0, eval_seconds = 0;  ///< checkpoints count in neither
  /// The evaluation's samples over eval_seconds; 0 when it did not say how many it scored.
  double eval_images_per_s = 0;
  Metrics metrics;  ///< the evaluation's
  /// The global step a run resumed at inside this epoch (the latest such), or -1. Its
  /// steady images_per_s is of the part after the resume.
  int64_t resumed_at_step = -1;
};

/// The record as a line of metrics.jsonl: its fields by name ("resumed_at_step" only when
/// resumed), then each metric by its name.
nlohmann::json to_json(const EpochRecord& record);

struct TrainResult {
  std::vector<EpochRecord> epochs;  ///< this run's and, on a resume, the earlier ones'
  int64_t steps = 0;                ///< global steps done
  std::vector<float> losses;        ///< this run's steps' losses
  int stopped_by_signal = 0;        ///< the signal that stopped it, or 0
  std::string last_checkpoint;      ///< folder, or empty
  std::string weights;              ///< RUN_DIR/model.safetensors once complete, else empty
  std::vector<SkippedSample> skipped;
  /// The resume's (a checkpoint skipped and why, a start from step 0, the data moved), then the
  /// runner's (what was captured, ...).
  std::vector<std::string> notes;
  int64_t resumed_from = -1;  ///< the step resumed at, or -1 (none: also a --resume that
                              ///< found no checkpoint and started from step 0)
  /// Wall time from this run's first step to its last step's loss read (synchronized): the
  /// evaluations and checkpoints between its steps included.
  double seconds = 0;
  StageTiming timing;  ///< per stage, over this run's steps (TrainOptions::device_timing_every)
  /// What the run paid besides its steps: the Runner's start and its graphs' captures.
  RunSetup setup;
  /// Host seconds of TrainJob::prepare_evaluation in this run (during its first epoch, left out
  /// of that epoch's training time); 0 when it did not run.
  double evaluation_prepare_seconds = 0;
};

/// The setup as reports give it: {"prepare_s", "capture_s", "graphs", "graphs_kept"}.
nlohmann::json to_json(const RunSetup& setup);

/// Thrown when a step's loss is NaN or infinite: what() names the step, the epoch and the
/// last good checkpoint, which is kept, and the likely cause: the starting weights, when they
/// held non-finite values before the first step, else the learning rate.
class NonFiniteLoss : public Error {
 public:
  using Error::Error;
};

class Trainer {
 public:
  /// Validates the options (InvalidArgument naming the first bad one) and the run folder: an
  /// existing non-empty out_dir without resume is refused. On resume, loads the newest valid
  /// checkpoint into the model and optimizer now (tandem::Error when every one is damaged,
  /// naming each; InvalidArgument when it was made for another configuration or other data,
  /// naming what differs, or does not fit the model); without any, the run starts at step 0.
  /// What it skipped or decided is in resume_notes(), each also one line on stderr.
  Trainer(TrainJob job, TrainOptions options);
  ~Trainer();

  /// Trains the remaining epochs (or steps). Throws RunError / NonFiniteLoss / tandem::Error (a
  /// checkpoint that cannot be written) after keeping the last good checkpoint.
  TrainResult run();

  /// Without a run folder, after run(): makes the next run() train `options`' steps from its
  /// first_step (where the last run ended, to continue it), with its stop flag, callbacks,
  /// schedule, trace and device timing, on this Trainer's Runner: the lanes' threads and the
  /// CUDA graphs the last run captured are kept (Runner::prepare), so it replays from its first
  /// step. InvalidArgument when `options` differ from the current ones in what the Runner was
  /// built for (mode, batch size, workers, seed, skip_bad, group) or name a run folder.
  void set_next_run(TrainOptions options);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t start_step() const { return start_step_; }
  /// Whether a checkpoint was loaded (a --resume that found none starts afresh: false).
  bool resumed() const { return resumed_; }
  const std::vector<std::string>& resume_notes() const { return resume_notes_; }

 private:
  // The running sums of the epoch a checkpoint was taken inside (format 2's "epoch_so_far").
  struct EpochSums {
    int64_t steps = 0;
    double loss_sum = 0;  // this rank's losses, summed in step order (bitwise reproducible)
    double seconds = 0;   // training time, evaluation and checkpoints excluded
    int64_t images = 0;   // every rank's
  };
  void load_checkpoint(const Checkpoint& c, const std::string& folder);
  /// The Runner of the next run: made by the first, kept by the later ones (set_next_run).
  Runner& runner_for_run();
  struct Pass;  // one run(): the bookkeeping between the Runner's steps
  TrainJob job_;
  TrainOptions options_;
  int64_t steps_per_epoch_ = 0;
  int64_t start_step_ = 0;
  int world_ = 1, rank_ = 0;  // data parallel: this process among the group's (1, 0: alone)
  bool resumed_ = false;
  bool keeps_epochs_ = true;  // ends epochs between steps: a run folder's run, or an evaluating one
  std::string resumed_folder_;  // the checkpoint loaded, or empty
  std::vector<std::string> resume_notes_;
  nlohmann::json data_ids_;             // {"data": fingerprint, "val": ...}; rank 0's only
  EpochSums carried_;                   // of the epoch resumed inside; zero at an epoch end
  std::vector<EpochRecord> history_;    // from the checkpoint resumed
  std::vector<at::Tensor> resume_rng_;  // generator states to restore, in Runner order
  at::Tensor resume_default_rng_;       // the device's default generator
  std::unique_ptr<Runner> runner_;      // kept from one run() to the next
  bool evaluation_prepared_ = false;    // TrainJob::prepare_evaluation ran (once a Trainer)
};

/// Installs SIGINT and SIGTERM handlers that store the signal in `flag` (the first one; a
/// second signal of the same kind restores the default action, so a second Ctrl-C kills).
void install_stop_handlers(std::atomic<int>* flag);

}  // namespace tandem::train
