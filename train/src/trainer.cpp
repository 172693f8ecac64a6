// Trainer: epochs, evaluation, metrics, checkpoints, resume and signals over one Runner pass
// (see trainer.h for where each piece runs).
#include "tandem/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <sstream>

#include "tandem/models/safetensors.h"
#include "tandem/runner.h"
#include "tandem/train/checkpoint.h"

namespace tandem::train {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool non_empty_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return false;
  bool any = false;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) any = true;
  ::closedir(d);
  return any;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

at::Generator default_generator(c10::Device device) {
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
  return at::detail::getDefaultCPUGenerator();
}

}  // namespace

nlohmann::json to_json(const EpochRecord& r) {
  nlohmann::json j{{"epoch", r.epoch},
                   {"step", r.step},
                   {"train_loss", r.train_loss},
                   {"lr", r.lr},
                   {"images_per_s", r.images_per_s},
                   {"epoch_images_per_s", r.epoch_images_per_s},
                   {"train_seconds", r.train_seconds},
                   {"eval_seconds", r.eval_seconds}};
  for (const auto& [k, v] : r.metrics) j[k] = v;
  return j;
}

namespace {

EpochRecord from_json(const nlohmann::json& j) {
  EpochRecord r;
  r.epoch = j.at("epoch").get<int64_t>();
  r.step = j.at("step").get<int64_t>();
  r.train_loss = j.at("train_loss").get<double>();
  r.lr = j.at("lr").get<double>();
  r.images_per_s = j.at("images_per_s").get<double>();
  r.epoch_images_per_s = j.value("epoch_images_per_s", r.images_per_s);
  r.train_seconds = j.at("train_seconds").get<double>();
  r.eval_seconds = j.at("eval_seconds").get<double>();
  static const char* kFixed[] = {"epoch",         "step",          "train_loss",
                                 "lr",            "images_per_s",  "epoch_images_per_s",
                                 "train_seconds", "eval_seconds"};
  for (const auto& [k, v] : j.items())
    if (std::find(std::begin(kFixed), std::end(kFixed), k) == std::end(kFixed) && v.is_number())
      r.metrics[k] = v.get<double>();
  return r;
}

// The keys whose values differ between two configs, for a refused resume.
std::string config_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  std::string out;
  for (const auto& [k, v] : now.items())
    if (!saved.contains(k) || saved.at(k) != v)
      out += (out.empty() ? "" : ", ") + k + ": checkpoint " +
             (saved.contains(k) ? saved.at(k).dump() : std::string("(none)")) + ", now " +
             v.dump();
  for (const auto& [k, v] : saved.items())
    if (!now.contains(k)) out += (out.empty() ? "" : ", ") + k + ": checkpoint " + v.dump() +
                                 ", now (none)";
  return out;
}

// Thrown from the hook to end the run on a stop request (the runner wraps it in a RunError).
struct StopRequested : Error {
  StopRequested() : Error("stop requested") {}
};

std::atomic<int>* g_stop_flag = nullptr;
// Async-signal-safe: one lock-free atomic store. SA_RESETHAND (below) makes a second signal of
// the kind take the default action, so a second Ctrl-C kills a stop that hangs.
extern "C" void on_stop_signal(int sig) {
  if (g_stop_flag) {
    int expected = 0;
    g_stop_flag->compare_exchange_strong(expected, sig);
  }
}

}  // namespace

void install_stop_handlers(std::atomic<int>* flag) {
  g_stop_flag = flag;
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // a second signal of the kind kills
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

Trainer::Trainer(TrainJob job, TrainOptions options)
    : job_(std::move(job)), options_(std::move(options)) {
  const TrainOptions& o = options_;
  TANDEM_CHECK_ARG(o.epochs >= 1, "epochs ", o.epochs, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(o.batch_size >= 1, "batch size ", o.batch_size, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(o.mode != Mode::kAuto, "the trainer takes a resolved mode, not auto");
  TANDEM_CHECK_ARG(!o.out_dir.empty(), "no run folder given: expected --out RUN_DIR");
  TANDEM_CHECK_ARG(o.checkpoint_every >= 0, "checkpoint interval ", o.checkpoint_every,
                   " is not valid: expected >= 0 steps (0: at each epoch end)");
  TANDEM_CHECK_ARG(job_.model, "train job '", job_.name, "' has no model to save");
  const DataSource& data = job_.workload.data;
  TANDEM_CHECK_ARG(data.kind() == DataSource::Kind::kDataset && data.drop_last(),
                   "train job '", job_.name,
                   "': expected a dataset source with drop_last (DataSource::from_dataset)");
  steps_per_epoch_ = data.batches_per_epoch(o.batch_size);
  TANDEM_CHECK_ARG(steps_per_epoch_ >= 1, "the training set's ", data.dataset()->size(),
                   " samples make no full batch of ", o.batch_size,
                   ": expected a smaller --batch-size");
  job_.config["batch_size"] = o.batch_size;
  job_.config["epochs"] = o.epochs;
  job_.config["seed"] = o.seed;

  if (!o.resume) {
    TANDEM_CHECK_ARG(!non_empty_dir(o.out_dir), "run folder ", o.out_dir,
                     " already exists and is not empty: pass --resume to continue that run, "
                     "or choose a new --out (nothing is overwritten)");
    make_dirs(o.out_dir);
    write_file_atomic(o.out_dir + "/config.json", job_.config.dump(2) + "\n");
    return;
  }
  // Checked before a store is opened: opening one makes its folder, which would turn a mistyped
  // --out into a new, non-empty run folder.
  TANDEM_CHECK_ARG(exists(o.out_dir + "/checkpoints"), "--resume: no checkpoint in ", o.out_dir,
                   "/checkpoints: expected a run folder written by tandem train");
  const CheckpointStore store(o.out_dir + "/checkpoints", o.keep_checkpoints);
  const std::optional<std::string> latest = store.latest();
  TANDEM_CHECK_ARG(latest.has_value(), "--resume: no checkpoint in ", store.dir(),
                   ": expected a run folder written by tandem train");
  Checkpoint c = CheckpointStore::load(*latest);
  const nlohmann::json saved = c.state.value("config", nlohmann::json::object());
  const std::string diff = config_difference(saved, job_.config);
  TANDEM_CHECK_ARG(diff.empty(), "--resume: checkpoint ", *latest,
                   " was made by another configuration (", diff,
                   "): expected the same model, data and settings");
  models::load_state_dict(*job_.model, c.model);
  job_.workload.train.optimizer->load_state(c.optimizer);
  for (const auto& [name, t] : c.rng) {
    if (name == "default")
      resume_default_rng_ = t;
    else
      resume_rng_.push_back(t);
  }
  for (const auto& e : c.state.value("epochs", nlohmann::json::array()))
    history_.push_back(from_json(e));
  start_step_ = c.step;
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  const TrainOptions& o = options_;
  const int64_t spe = steps_per_epoch_;
  const int64_t total = o.epochs * spe;
  const int64_t start = start_step_;
  TrainResult result;
  result.epochs = history_;
  result.steps = start;
  result.resumed_from = o.resume ? start : -1;
  CheckpointStore store(o.out_dir + "/checkpoints", o.keep_checkpoints);
  const c10::Device device = job_.workload.device;
  auto optimizer = job_.workload.train.optimizer;

  RunOptions ro;
  ro.mode = o.mode;
  ro.batch_size = o.batch_size;
  ro.workers = o.workers;
  ro.seed = o.seed;
  ro.skip_bad = o.skip_bad;
  ro.first_step = start;
  ro.record_generator_states = true;
  Runner runner(job_.workload, ro);
  const std::vector<at::Generator> gens = runner.generators();
  if (o.resume) {
    TANDEM_CHECK_ARG(resume_rng_.size() == gens.size(), "--resume: the checkpoint holds ",
                     resume_rng_.size(), " generator states, the job has ", gens.size());
    for (size_t i = 0; i < gens.size(); ++i) {
      at::Generator g = gens[i];
      g.set_state(resume_rng_[i]);
    }
    if (resume_default_rng_.defined()) default_generator(device).set_state(resume_default_rng_);
  }

  auto write_metrics = [&](const std::vector<EpochRecord>& epochs) {
    std::string jsonl, csv;
    std::vector<std::string> metric_names;
    for (const auto& r : epochs)
      for (const auto& [k, v] : r.metrics)
        if (std::find(metric_names.begin(), metric_names.end(), k) == metric_names.end())
          metric_names.push_back(k);
    csv = "epoch,step,train_loss";
    for (const auto& k : metric_names) csv += "," + k;
    csv += ",lr,images_per_s,epoch_images_per_s,train_seconds,eval_seconds\n";
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
           << r.train_seconds << ','
           << r.eval_seconds << '\n';
      csv += line.str();
    }
    write_file_atomic(o.out_dir + "/metrics.jsonl", jsonl);
    write_file_atomic(o.out_dir + "/metrics.csv", csv);
  };

  if (start >= total) {  // the run was complete
    result.weights = exists(o.out_dir + "/model.safetensors") ? o.out_dir + "/model.safetensors"
                                                              : std::string();
    return result;
  }

  Pipeline& pipeline = runner.prepare(total - start);
  const int last = pipeline.num_stages() - 1;
  const Lane& train_lane = pipeline.lane_of(last);

  // Host-side bookkeeping, touched only by the train stage's thread (and after run()).
  std::vector<float> losses;   // this run's, read so far
  size_t checked = 0;          // losses[0, checked) are finite
  std::string nonfinite;       // set when a step's loss was not finite
  int64_t last_saved = start;  // the step of the newest checkpoint (the resumed one counts)
  result.last_checkpoint = store.latest().value_or("");
  double eval_seconds_total = 0;
  Clock::time_point run_start = Clock::now(), epoch_start = run_start, last_progress = run_start;
  double epoch_eval_excluded = 0;  // eval and checkpoint time inside the current epoch
  // The steady rate of an epoch is timed from its `steady_skip`-th step on: while the train
  // lane evaluates and checkpoints, the feed stages run ahead (up to the pipeline's depth), so
  // the first steps after an epoch boundary find their inputs already made and would count
  // work done during the pause. Past the depth the lead is what it is at the epoch's end.
  const int64_t steady_skip = std::min<int64_t>(pipeline.depth() + 2, spe / 2);
  bool steady_marked = false;
  int64_t steady_from = 0;
  Clock::time_point steady_t = run_start;
  double steady_excluded = 0;  // checkpoint time since the mark
  double lr_now = 0;

  // Reads the losses of steps done (synchronizes the current stream: call under the train
  // lane) and stops the run at the first non-finite one.
  auto read_losses = [&]() {
    losses = runner.losses();
    for (; checked < losses.size(); ++checked)
      if (!std::isfinite(losses[checked])) {
        const int64_t g = start + static_cast<int64_t>(checked);
        nonfinite = "the loss of step " + std::to_string(g) + " (epoch " +
                    std::to_string(g / spe + 1) + ") is " +
                    (std::isnan(losses[checked]) ? "NaN" : "infinite") +
                    ": training stopped; the last good checkpoint, " +
                    (result.last_checkpoint.empty() ? std::string("none")
                                                    : result.last_checkpoint) +
                    ", is kept (try a lower --lr)";
        throw NonFiniteLoss(nonfinite);
      }
  };

  // A checkpoint of the state after `g` global steps; `item` = g - start.
  auto checkpoint = [&](int64_t g) {
    const auto t = Clock::now();
    read_losses();  // never save weights a non-finite loss produced
    Checkpoint c;
    c.step = g;
    c.model = models::state_dict(*job_.model);
    c.optimizer = optimizer->state();
    const std::vector<at::Tensor> states = runner.generator_states_before(g - start);
    for (size_t i = 0; i < states.size(); ++i)
      c.rng.emplace_back("generator." + std::to_string(i), states[i]);
    c.rng.emplace_back("default", default_generator(device).get_state());
    nlohmann::json history = nlohmann::json::array();
    for (const auto& r : result.epochs) history.push_back(to_json(r));
    c.state = {{"config", job_.config},
               {"epoch", g / spe},
               {"step_in_epoch", g % spe},
               {"steps_per_epoch", spe},
               {"epochs", history}};
    result.last_checkpoint = store.save(c);
    last_saved = g;
    epoch_eval_excluded += seconds_since(t);
    if (steady_marked) steady_excluded += seconds_since(t);
  };

  // The end of the epoch that finishes at global step g: evaluate, record, checkpoint.
  auto end_epoch = [&](int64_t g) {
    read_losses();
    const double train_seconds = seconds_since(epoch_start) - epoch_eval_excluded;
    EpochRecord r;
    r.epoch = g / spe;
    r.step = g;
    const int64_t from = std::max(g - spe, start) - start, to = g - start;
    double sum = 0;
    for (int64_t i = from; i < to; ++i) sum += losses[static_cast<size_t>(i)];
    r.train_loss = to > from ? sum / static_cast<double>(to - from) : 0;
    r.lr = lr_now;
    r.train_seconds = train_seconds;
    r.epoch_images_per_s = train_seconds > 0 ? static_cast<double>((to - from) * o.batch_size) /
                                                   train_seconds
                                             : 0;
    const double steady_seconds = seconds_since(steady_t) - steady_excluded;
    r.images_per_s = steady_marked && g > steady_from && steady_seconds > 0
                         ? static_cast<double>((g - steady_from) * o.batch_size) / steady_seconds
                         : r.epoch_images_per_s;
    steady_marked = false;
    const auto t = Clock::now();
    if (job_.evaluate) r.metrics = job_.evaluate(train_lane);
    r.eval_seconds = seconds_since(t);
    eval_seconds_total += r.eval_seconds;
    result.epochs.push_back(r);
    write_metrics(result.epochs);
    if (o.on_epoch) o.on_epoch(r);
    epoch_eval_excluded = 0;
    checkpoint(g);
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
  };

  int stopped = 0;
  auto hook = [&](int stage, int64_t item) {
    if (stage != last) return;
    const int64_t g = start + item;
    LaneGuard guard(train_lane, "between steps");
    if (item > 0 && g % spe == 0)
      end_epoch(g);
    else if (item > 0 && o.checkpoint_every > 0 && g % o.checkpoint_every == 0)
      checkpoint(g);
    if (!steady_marked && item >= steady_skip && g % spe >= steady_skip) {
      read_losses();  // a sync of the train lane: the window starts with nothing in flight
      steady_marked = true;
      steady_from = g;
      steady_t = Clock::now();
      steady_excluded = 0;
    }
    if (o.stop && o.stop->load() != 0) {
      if (last_saved != g) checkpoint(g);
      stopped = o.stop->load();
      throw StopRequested();
    }
    if (o.schedule) {
      lr_now = o.schedule(g);
      optimizer->set_lr(lr_now);
    }
    if (o.on_progress && seconds_since(last_progress) >= o.progress_seconds) {
      last_progress = Clock::now();
      read_losses();
      TrainOptions::Progress p;
      p.epoch = g / spe;
      p.epochs = o.epochs;
      p.step_in_epoch = g % spe;
      p.steps_per_epoch = spe;
      p.step = g;
      p.total_steps = total;
      p.loss = losses.empty() ? 0 : losses.back();
      const double busy = seconds_since(run_start) - eval_seconds_total;
      p.images_per_s = busy > 0 ? static_cast<double>(item * o.batch_size) / busy : 0;
      o.on_progress(p);
    }
  };

  try {
    runner.run(hook);
  } catch (const std::exception&) {
    result.skipped = runner.skipped();
    if (!nonfinite.empty()) throw NonFiniteLoss(nonfinite);
    if (stopped == 0) throw;
    result.stopped_by_signal = stopped;
    result.steps = last_saved;
    result.losses = losses;
    result.notes = runner.notes();
    return result;
  }
  // The last epoch's end: after run(), the current stream has waited for every lane.
  end_epoch(total);
  result.steps = total;
  result.losses = runner.losses();
  result.skipped = runner.skipped();
  result.notes = runner.notes();
  result.weights = o.out_dir + "/model.safetensors";
  models::save_safetensors(result.weights, models::state_dict(*job_.model),
                           {{"format", "pt"}, {"job", job_.name}});
  return result;
}

}  // namespace tandem::train
