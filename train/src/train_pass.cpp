// Trainer::run: one Runner pass over the steps left, and what happens between two steps —
// losses read, an epoch ended (evaluated, recorded, checkpointed), a checkpoint, a stop, the
// learning rate, progress — each a named step of Trainer::Pass. trainer.cpp builds the Trainer
// and resumes it; this file trains it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>

#include "evaluation_thread.h"
#include "posix_fs.h"
#include "tandem/distributed/process_group.h"
#include "tandem/models/safetensors.h"
#include "tandem/runner.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/trainer.h"

namespace tandem::train {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr auto kMax = distributed::ProcessGroup::HostOp::kMax;
constexpr auto kMean = distributed::ProcessGroup::HostOp::kMean;

at::Generator default_generator(c10::Device device) {
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
  return at::detail::getDefaultCPUGenerator();
}

/// Every rank's generator states (uint8 CPU tensors), gathered on every rank, in rank order.
std::vector<std::vector<at::Tensor>> gather_states(distributed::ProcessGroup& group,
                                                   const std::vector<at::Tensor>& states) {
  std::vector<uint8_t> mine;  // per state: its byte count (8 bytes), then its bytes
  for (const auto& t : states) {
    const at::Tensor c = t.contiguous();
    const uint64_t n = static_cast<uint64_t>(c.numel());
    const auto* np = reinterpret_cast<const uint8_t*>(&n);
    mine.insert(mine.end(), np, np + sizeof n);
    const auto* d = c.data_ptr<uint8_t>();
    mine.insert(mine.end(), d, d + n);
  }
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& bytes : group.all_gather_host(mine)) {
    std::vector<at::Tensor> theirs;
    for (size_t at_byte = 0; at_byte < bytes.size();) {
      uint64_t n = 0;
      std::memcpy(&n, bytes.data() + at_byte, sizeof n);
      at_byte += sizeof n;
      at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kByte);
      std::memcpy(t.data_ptr<uint8_t>(), bytes.data() + at_byte, n);
      at_byte += n;
      theirs.push_back(t);
    }
    out.push_back(std::move(theirs));
  }
  return out;
}

/// Every rank's value, gathered on every rank, in rank order.
std::vector<double> gather_doubles(distributed::ProcessGroup& group, double mine) {
  std::vector<uint8_t> bytes(sizeof(double));
  std::memcpy(bytes.data(), &mine, sizeof(double));
  std::vector<double> out;
  for (const auto& theirs : group.all_gather_host(bytes)) {
    double v = 0;
    std::memcpy(&v, theirs.data(), sizeof v);
    out.push_back(v);
  }
  return out;
}

// Thrown from the hook to end the run on a stop request (the runner wraps it in a RunError).
struct StopRequested : Error {
  StopRequested() : Error("stop requested") {}
};

/// The epoch records as metrics.jsonl and metrics.csv in `out_dir` (each written whole): a
/// metric column for every name any epoch reported, in the order first seen.
void write_metrics(const std::string& out_dir, const std::vector<EpochRecord>& epochs) {
  std::string jsonl, csv;
  std::vector<std::string> metric_names;
  for (const auto& r : epochs)
    for (const auto& [k, v] : r.metrics)
      if (std::find(metric_names.begin(), metric_names.end(), k) == metric_names.end())
        metric_names.push_back(k);
  csv = "epoch,step,train_loss";
  for (const auto& k : metric_names) csv += "," + k;
  csv +=
      ",lr,images_per_s,epoch_images_per_s,train_seconds,eval_seconds,eval_images_per_s,"
      "resumed_at_step\n";
  for (const auto& r : epochs) {
    jsonl += to_json(r).dump() + "\n";
    std::ostringstream line;
    line.precision(8);
    line << r.epoch << ',' << r.step << ',' << r.train_loss;
    for (const auto& k : metric_names) {
      line << ',';
      if (r.metrics.count(k)) line << r.metrics.at(k);
    }
    line << ',' << r.lr << ',' << r.images_per_s << ',' << r.epoch_images_per_s << ','
         << r.train_seconds << ',' << r.eval_seconds << ',';
    if (r.eval_images_per_s > 0) line << r.eval_images_per_s;  // empty: not said
    line << ',';
    if (r.resumed_at_step >= 0) line << r.resumed_at_step;  // empty: not resumed
    line << '\n';
    csv += line.str();
  }
  write_file_atomic(out_dir + "/metrics.jsonl", jsonl);
  write_file_atomic(out_dir + "/metrics.csv", csv);
}

/// The name of the first floating-point tensor of `tensors` that holds a non-finite value;
/// empty when none does (one synchronization).
std::string first_non_finite(const models::NamedTensors& tensors) {
  at::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<at::Tensor> finite;
  for (const auto& [name, t] : tensors)
    if (t.is_floating_point()) {
      names.push_back(name);
      finite.push_back(t.detach().isfinite().all());
    }
  if (finite.empty()) return {};
  const at::Tensor ok = at::stack(finite).cpu();
  for (size_t i = 0; i < names.size(); ++i)
    if (!ok[static_cast<int64_t>(i)].item<bool>()) return names[i];
  return {};
}

}  // namespace

// One run(): the host-side bookkeeping between the Runner's steps, touched only by the train
// stage's thread (and after the Runner's pass, by run()'s).
struct Trainer::Pass {
  explicit Pass(Trainer& trainer);

  /// Restores the checkpoint's generator states into the Runner's generators and the device's.
  void restore_generators();
  /// Why a non-finite loss may have come: the starting weights when one of them is not finite
  /// (the learning rate is then not the cause to suggest), else the learning rate.
  std::string likely_cause() const;
  /// The Runner's hook: on the train stage's thread as it starts step `item` of this pass, the
  /// steps before it queued.
  void after_step(int64_t item);
  /// Reads the losses of steps done (synchronizes the current stream: call under the train
  /// lane) and stops the run at the first non-finite one — on every rank: in a data-parallel
  /// run the ranks agree first (every rank calls this at the same steps), so none goes on alone
  /// and rank 0 never saves weights another rank's loss spoiled.
  void read_losses();
  /// The running sums of the epoch that starts at global step `first`, after global step g (its
  /// losses read): the checkpoint's carried ones first when the run resumed inside it, then
  /// this run's in step order, so the loss sum is bitwise the uninterrupted run's. `seconds`:
  /// this run's training time in it so far.
  EpochSums epoch_sums(int64_t first, int64_t g, double seconds) const;
  /// A checkpoint of the state after `g` global steps (rank 0 writes it; every rank takes part).
  void checkpoint(int64_t g);
  /// The end of the epoch that finishes at global step g: evaluate, record, checkpoint.
  void end_epoch(int64_t g);
  /// The job's evaluation on the evaluation thread, the training's loaders paused meanwhile.
  Evaluation evaluate();
  /// TrainJob::prepare_evaluation on the evaluation thread, once a Trainer, its time left out of
  /// the epoch's.
  void prepare_evaluation();
  /// Starts the steady-rate window of the current epoch at global step g.
  void mark_steady(int64_t g);
  /// A stop requested, and whether to report progress now: alone, at every step; data parallel,
  /// agreed by every rank every kAgreeEvery steps (a store round trip; rank 0's clock decides).
  std::pair<int, bool> stop_and_report(int64_t g);
  void report_progress(int64_t item, int64_t g);
  /// The result of a pass a stop ended (its last checkpoint kept).
  TrainResult stopped_result();
  /// The result of a finished pass: the last epoch ended, the weights saved by rank 0.
  TrainResult finished_result();
  /// The stages' notes, then the job's (TrainJob::report), into the result.
  void add_notes();

  Trainer& t;
  const TrainOptions& o;
  const int64_t spe, total, start;
  const bool lead;
  distributed::ProcessGroup* const group;
  const c10::Device device;
  const std::shared_ptr<optim::Optimizer> optimizer;
  TrainResult result;
  const bool folder;                     // a run folder's run: records written, checkpoints
  std::optional<CheckpointStore> store;  // a run folder's
  Runner& runner;                        // the Trainer's
  std::string cause;  // of a non-finite loss (likely_cause), set before the first step
  int last_stage = 0;
  const Lane* train_lane = nullptr;

  std::vector<float> losses;  // this run's, read so far
  size_t checked = 0;         // losses[0, checked) are finite
  std::string nonfinite;      // set when a step's loss was not finite
  int64_t last_saved;         // the step of the newest checkpoint (the resumed one counts)
  double eval_seconds_total = 0;
  Clock::time_point run_start, epoch_start, last_progress;
  double epoch_eval_excluded = 0;  // eval and checkpoint time inside the current epoch
  // The steady rate of an epoch is timed from its `steady_skip`-th step on: while the train
  // lane evaluates and checkpoints, the feed stages run ahead (up to the pipeline's depth), so
  // the first steps after an epoch boundary find their inputs already made and would count
  // work done during the pause. Past the depth the lead is what it is at the epoch's end.
  int64_t steady_skip = 0;
  bool steady_marked = false;
  int64_t steady_from = 0;
  Clock::time_point steady_t;
  double steady_excluded = 0;  // checkpoint time since the mark
  double lr_now = 0;
  int stopped = 0;  // the signal a stop came from
};

namespace {

/// The global step after a run's last: a folder's run ends with its last epoch; one without a
/// folder after its steps (or epochs) from where it starts.
int64_t end_step(const TrainOptions& o, int64_t steps_per_epoch, int64_t start) {
  if (!o.out_dir.empty()) return o.epochs * steps_per_epoch;
  return start + (o.steps > 0 ? o.steps : o.epochs * steps_per_epoch);
}

RunOptions run_options(const TrainOptions& o, int64_t start, int rank, int world) {
  RunOptions ro;
  ro.mode = o.mode;
  ro.batch_size = o.batch_size;
  ro.workers = o.workers;
  ro.seed = o.seed;
  ro.skip_bad = o.skip_bad;
  ro.first_step = start;
  ro.record_generator_states = true;
  ro.stop = o.stop;  // a step stuck waiting on a loader worker ends when a stop is requested
  ro.rank = rank;
  ro.world_size = world;
  ro.trace = o.trace;
  return ro;
}

}  // namespace

Trainer::Pass::Pass(Trainer& trainer)
    : t(trainer),
      o(trainer.options_),
      spe(trainer.steps_per_epoch_),
      total(end_step(o, spe, trainer.start_step_)),
      start(trainer.start_step_),
      lead(trainer.rank_ == 0),
      group(o.group.get()),
      device(trainer.job_.workload.device),
      optimizer(trainer.job_.workload.train.optimizer),
      folder(!o.out_dir.empty()),
      runner(trainer.runner_for_run()),
      last_saved(start) {
  result.epochs = t.history_;
  result.steps = start;
  result.resumed_from = t.resumed_ ? start : -1;
  result.notes = t.resume_notes_;
  if (folder) store.emplace(o.out_dir + "/checkpoints", o.keep_checkpoints);
}

void Trainer::Pass::restore_generators() {
  const std::vector<at::Generator> gens = runner.generators();
  TANDEM_CHECK_ARG(t.resume_rng_.size() == gens.size(), "--resume: the checkpoint holds ",
                   t.resume_rng_.size(), " generator states, the job has ", gens.size());
  for (size_t i = 0; i < gens.size(); ++i) {
    at::Generator g = gens[i];
    g.set_state(t.resume_rng_[i]);
  }
  if (t.resume_default_rng_.defined()) default_generator(device).set_state(t.resume_default_rng_);
}

std::string Trainer::Pass::likely_cause() const {
  if (!t.job_.weights) return "try a lower learning rate";
  const std::string bad_start = first_non_finite(t.job_.weights.state_dict());
  if (bad_start.empty()) return "try a lower --lr";
  const nlohmann::json w = t.job_.config.value("weights", nlohmann::json());
  const std::string weights = w.is_string() ? w.get<std::string>() : std::string();
  const std::string source = t.resumed_        ? "checkpoint " + t.resumed_folder_
                             : weights.empty() ? std::string("the job's model")
                                               : "--weights " + weights;
  return "the starting weights (" + source + ") hold non-finite values (" + bad_start + ")";
}

void Trainer::Pass::read_losses() {
  losses = runner.losses();
  for (; checked < losses.size() && nonfinite.empty(); ++checked)
    if (!std::isfinite(losses[checked])) {
      const int64_t g = start + static_cast<int64_t>(checked);
      nonfinite = "the loss of step " + std::to_string(g) +
                  (spe > 0 ? " (epoch " + std::to_string(g / spe + 1) + ")" : std::string()) +
                  (t.world_ > 1 ? " on rank " + std::to_string(t.rank_) : std::string()) + " is " +
                  (std::isnan(losses[checked]) ? "NaN" : "infinite");
    }
  bool stop = !nonfinite.empty();
  if (group) stop = group->all_reduce_host({stop ? 1.0 : 0.0}, kMax)[0] > 0;
  if (!stop) return;
  if (nonfinite.empty()) nonfinite = "a loss on another rank is not finite";
  nonfinite += ": training stopped" +
               (folder ? "; the last good checkpoint, " +
                             (result.last_checkpoint.empty() ? std::string("none")
                                                             : result.last_checkpoint) +
                             ", is kept"
                       : std::string()) +
               " (" + cause + ")";
  throw NonFiniteLoss(nonfinite);
}

Trainer::EpochSums Trainer::Pass::epoch_sums(int64_t first, int64_t g, double seconds) const {
  EpochSums e = first < start ? t.carried_ : EpochSums{};
  const int64_t from = std::max(first, start) - start, to = g - start;
  for (int64_t i = from; i < to; ++i) e.loss_sum += losses[static_cast<size_t>(i)];
  e.steps += to - from;
  e.seconds += seconds;
  e.images += (to - from) * o.batch_size * t.world_;
  return e;
}

void Trainer::Pass::checkpoint(int64_t g) {
  const auto t0 = Clock::now();
  read_losses();  // never save weights a non-finite loss produced
  // Inside an epoch: its running sums, every rank's loss sum (gathered to rank 0 in rank
  // order; each rank's mean goes into the record's mean over the ranks).
  std::optional<EpochSums> sums;
  std::vector<double> loss_sums;
  if (g % spe != 0) {
    sums =
        epoch_sums(g - g % spe, g,
                   std::chrono::duration<double>(t0 - epoch_start).count() - epoch_eval_excluded);
    loss_sums = group ? gather_doubles(*group, sums->loss_sum) : std::vector{sums->loss_sum};
  }
  Checkpoint c;
  c.step = g;
  c.model = t.job_.weights.state_dict();
  c.optimizer = optimizer->state();
  // The loss scale's state rides with the optimizer's, prefixed (fp16: a resumed run continues
  // the scale instead of overflowing its way down from the initial one again).
  if (const auto& scale = t.job_.workload.train.loss_scale)
    for (const auto& [name, tensor] : scale->state())
      c.optimizer.emplace_back(std::string(kLossScalePrefix) + name, tensor);
  std::vector<at::Tensor> states = runner.generator_states_before(g - start);
  states.push_back(default_generator(device).get_state());
  // Data parallel: every rank's states, gathered to rank 0, which alone writes.
  const std::vector<std::vector<at::Tensor>> all =
      group ? gather_states(*group, states) : std::vector<std::vector<at::Tensor>>{states};
  if (!lead) {
    last_saved = g;
    return;
  }
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string prefix = t.world_ > 1 ? "rank" + std::to_string(r) + "." : "";
    for (size_t i = 0; i + 1 < all[r].size(); ++i)
      c.rng.emplace_back(prefix + "generator." + std::to_string(i), all[r][i]);
    c.rng.emplace_back(prefix + "default", all[r].back());
  }
  nlohmann::json history = nlohmann::json::array();
  for (const auto& r : result.epochs) history.push_back(to_json(r));
  c.state = {{"config", t.job_.config},  {"data_fingerprints", t.data_ids_}, {"epoch", g / spe},
             {"step_in_epoch", g % spe}, {"steps_per_epoch", spe},           {"epochs", history}};
  if (t.job_.save_state) c.state["job_state"] = t.job_.save_state();
  if (sums)
    c.state["epoch_so_far"] = {{"steps", sums->steps},
                               {"loss_sums", loss_sums},
                               {"seconds", sums->seconds},
                               {"images", sums->images}};
  result.last_checkpoint = store->save(c);
  last_saved = g;
  epoch_eval_excluded += seconds_since(t0);
  if (steady_marked) steady_excluded += seconds_since(t0);
}

Evaluation Trainer::Pass::evaluate() {
  // The evaluation's loader gets the cores: the training's workers wait at their next sample
  // until it is done (resumed even if it throws).
  runner.pause_loading(true);
  struct Resume {
    Runner& r;
    ~Resume() { r.pause_loading(false); }
  } resume{runner};
  const Lane& lane = *train_lane;
  t.evaluation_prepared_ = true;  // what a rehearsal would load, this loads
  // Every evaluation on one thread (why: evaluation_thread.h).
  return detail::on_evaluation_thread<Evaluation>(lane, [&] { return t.job_.evaluate(lane); });
}

void Trainer::Pass::prepare_evaluation() {
  t.evaluation_prepared_ = true;
  const auto t0 = Clock::now();
  const Lane& lane = *train_lane;
  detail::on_evaluation_thread<int>(lane, [&] {
    t.job_.prepare_evaluation(lane);
    return 0;
  });
  const double seconds = seconds_since(t0);
  result.evaluation_prepare_seconds += seconds;
  epoch_eval_excluded += seconds;
  if (steady_marked) steady_excluded += seconds;
}

void Trainer::Pass::end_epoch(int64_t g) {
  read_losses();
  const EpochSums e = epoch_sums(g - spe, g, seconds_since(epoch_start) - epoch_eval_excluded);
  EpochRecord r;
  r.epoch = g / spe;
  r.step = g;
  if (g - spe < start && t.resumed_) r.resumed_at_step = start;
  r.train_loss = e.steps > 0 ? e.loss_sum / static_cast<double>(e.steps) : 0;
  if (group) r.train_loss = group->all_reduce_host({r.train_loss}, kMean)[0];
  // Without a schedule the optimizer's own (a user may set it between fits): read, not assumed.
  r.lr = o.schedule ? lr_now : optimizer->learning_rate();
  r.train_seconds = e.seconds;
  // img/s counts every rank's images: the ranks run in lockstep.
  r.epoch_images_per_s = e.seconds > 0 ? static_cast<double>(e.images) / e.seconds : 0;
  const double steady_seconds = seconds_since(steady_t) - steady_excluded;
  r.images_per_s =
      steady_marked && g > steady_from && steady_seconds > 0
          ? static_cast<double>((g - steady_from) * o.batch_size * t.world_) / steady_seconds
          : r.epoch_images_per_s;
  steady_marked = false;
  const auto t0 = Clock::now();
  int64_t scored = 0;
  if (t.job_.evaluate && lead) {
    Evaluation ev = evaluate();
    r.metrics = std::move(ev.metrics);
    scored = ev.samples;
  }
  r.eval_seconds = seconds_since(t0);
  if (scored > 0 && r.eval_seconds > 0)
    r.eval_images_per_s = static_cast<double>(scored) / r.eval_seconds;
  eval_seconds_total += r.eval_seconds;
  result.epochs.push_back(r);
  if (lead && folder) write_metrics(o.out_dir, result.epochs);
  if (o.on_epoch) o.on_epoch(r);
  epoch_eval_excluded = 0;
  if (folder) checkpoint(g);
  epoch_eval_excluded = 0;
  epoch_start = Clock::now();
  if (o.on_progress) {
    TrainOptions::Progress p;
    p.epoch = g / spe - 1;
    p.epochs = o.epochs;
    p.step_in_epoch = spe;
    p.steps_per_epoch = spe;
    p.step = g;
    p.total_steps = total;
    p.loss = losses.empty() ? 0 : losses.back();
    p.images_per_s = r.images_per_s;
    o.on_progress(p);
  }
}

void Trainer::Pass::mark_steady(int64_t g) {
  read_losses();  // a sync of the train lane: the window starts with nothing in flight
  steady_marked = true;
  steady_from = g;
  steady_t = Clock::now();
  steady_excluded = 0;
}

std::pair<int, bool> Trainer::Pass::stop_and_report(int64_t g) {
  const int stop_now = o.stop ? o.stop->load() : 0;
  const bool report = o.on_progress && seconds_since(last_progress) >= o.progress_seconds;
  if (!group) return {stop_now, report};
  if (g % kAgreeEvery != 0) return {0, false};
  const std::vector<double> v =
      group->all_reduce_host({static_cast<double>(stop_now), report ? 1.0 : 0.0}, kMax);
  return {static_cast<int>(v[0]), v[1] > 0};
}

void Trainer::Pass::report_progress(int64_t item, int64_t g) {
  last_progress = Clock::now();
  read_losses();
  if (!o.on_progress) return;
  TrainOptions::Progress p;
  p.epoch = spe > 0 ? g / spe : 0;
  p.epochs = o.epochs;
  p.step_in_epoch = spe > 0 ? g % spe : g - start;
  p.steps_per_epoch = spe;
  p.step = g;
  p.total_steps = total;
  p.loss = losses.empty() ? 0 : losses.back();
  const double busy = seconds_since(run_start) - eval_seconds_total;
  p.images_per_s = busy > 0 ? static_cast<double>(item * o.batch_size * t.world_) / busy : 0;
  o.on_progress(p);
}

void Trainer::Pass::after_step(int64_t item) {
  const int64_t g = start + item;
  LaneGuard guard(*train_lane, "between steps");
  // Once the first step is queued (the hook comes before step `item`'s work): the evaluation's
  // kernels load while that step runs on the device. An evaluation due first needs none.
  if (item >= 1 && lead && t.job_.evaluate && t.job_.prepare_evaluation &&
      !t.evaluation_prepared_ && !(t.keeps_epochs_ && g % spe == 0))
    prepare_evaluation();
  if (t.keeps_epochs_) {
    if (item > 0 && g % spe == 0)
      end_epoch(g);
    else if (item > 0 && o.checkpoint_every > 0 && g % o.checkpoint_every == 0)
      checkpoint(g);
    if (!steady_marked && item >= steady_skip && g % spe >= steady_skip) mark_steady(g);
  }
  const auto [stop_now, report] = stop_and_report(g);
  if (stop_now != 0) {
    if (folder && last_saved != g) checkpoint(g);
    stopped = stop_now;
    throw StopRequested();
  }
  if (o.schedule) {
    lr_now = o.schedule(g);
    optimizer->set_lr(lr_now);
  }
  if (report) report_progress(item, g);
}

void Trainer::Pass::add_notes() {
  for (const auto& n : runner.notes()) result.notes.push_back(n);
  if (!t.job_.report) return;
  std::string note = t.job_.report();
  if (!note.empty()) result.notes.push_back(std::move(note));
}

TrainResult Trainer::Pass::stopped_result() {
  result.stopped_by_signal = stopped;
  // A folder's run continues from its last checkpoint; one without, from its last step.
  if (!folder) losses = runner.losses();
  result.losses = losses;
  result.steps = folder ? last_saved : start + static_cast<int64_t>(losses.size());
  result.seconds = seconds_since(run_start);
  result.setup = runner.setup();
  add_notes();
  return result;
}

TrainResult Trainer::Pass::finished_result() {
  // After the Runner's pass, the current stream has waited for every lane.
  read_losses();
  result.seconds = seconds_since(run_start);
  result.setup = runner.setup();
  if (o.device_timing_every > 0) result.timing = runner.timing();
  if (t.keeps_epochs_ && total % spe == 0) end_epoch(total);
  result.steps = total;
  result.losses = losses;  // every step's: read above (and again by the last epoch's end)
  result.skipped = runner.skipped();
  add_notes();
  if (!lead || !folder) return result;
  result.weights = o.out_dir + "/model.safetensors";
  models::save_safetensors(result.weights, t.job_.weights.state_dict(),
                           {{"format", "pt"}, {"job", t.job_.name}});
  return result;
}

Runner& Trainer::runner_for_run() {
  if (!runner_) {
    runner_ =
        std::make_unique<Runner>(job_.workload, run_options(options_, start_step_, rank_, world_));
  } else {
    runner_->set_first_step(start_step_);
    runner_->set_trace(options_.trace);
    runner_->set_stop(options_.stop);
  }
  return *runner_;
}

TrainResult Trainer::run() {
  Pass pass(*this);
  const TrainOptions& o = options_;
  if (o.resume) pass.restore_generators();
  if (pass.folder && pass.start >= pass.total) {  // the run was complete
    pass.result.last_checkpoint = resumed_folder_;
    pass.result.weights = fs::exists(o.out_dir + "/model.safetensors")
                              ? o.out_dir + "/model.safetensors"
                              : std::string();
    return pass.result;
  }
  pass.cause = pass.likely_cause();
  pass.runner.prepare(pass.total - pass.start);
  if (o.device_timing_every > 0) pass.runner.set_timing(0, o.device_timing_every);
  pass.last_stage = pass.runner.num_stages() - 1;
  pass.train_lane = &pass.runner.train_lane();
  pass.result.last_checkpoint = resumed_folder_;
  pass.run_start = pass.epoch_start = pass.last_progress = pass.steady_t = Clock::now();
  pass.steady_skip = std::min<int64_t>(pass.runner.depth() + 2, steps_per_epoch_ / 2);
  try {
    pass.runner.run([&pass](int stage, int64_t item) {
      if (stage == pass.last_stage) pass.after_step(item);
    });
  } catch (const std::exception&) {
    pass.result.skipped = pass.runner.skipped();
    if (!pass.nonfinite.empty()) throw NonFiniteLoss(pass.nonfinite);
    // A stop requested while a step waited on a stuck loader worker: the loader gave up, and
    // the run ends as a stop does, keeping its last checkpoint.
    if (pass.stopped == 0 && o.stop && o.stop->load() != 0) pass.stopped = o.stop->load();
    if (pass.stopped == 0) throw;
    return pass.stopped_result();
  }
  return pass.finished_result();
}

}  // namespace tandem::train
