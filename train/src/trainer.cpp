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

#include "tandem/dist/data_parallel.h"
#include "tandem/dist/process_group.h"
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
constexpr auto kMax = dist::ProcessGroup::HostOp::kMax;
constexpr auto kMean = dist::ProcessGroup::HostOp::kMean;

/// Every rank's generator states (uint8 CPU tensors), gathered on every rank, in rank order.
std::vector<std::vector<at::Tensor>> gather_states(dist::ProcessGroup& group,
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
  if (o.group) {
    world_ = o.group->world_size();
    rank_ = o.group->rank();
  }
  const bool lead = rank_ == 0;
  steps_per_epoch_ = data.batches_per_epoch(o.batch_size, world_);
  TANDEM_CHECK_ARG(steps_per_epoch_ >= 1, "the training set's ", data.dataset()->size(),
                   " samples make no full batch of ", o.batch_size,
                   ": expected a smaller --batch-size");
  job_.config["batch_size"] = o.batch_size;
  job_.config["epochs"] = o.epochs;
  job_.config["seed"] = o.seed;
  if (world_ > 1) job_.config["world_size"] = world_;

  if (!o.resume) {
    if (lead) {
      TANDEM_CHECK_ARG(!non_empty_dir(o.out_dir), "run folder ", o.out_dir,
                       " already exists and is not empty: pass --resume to continue that run, "
                       "or choose a new --out (nothing is overwritten)");
      make_dirs(o.out_dir);
      write_file_atomic(o.out_dir + "/config.json", job_.config.dump(2) + "\n");
    }
    // Data parallel: the others wait for rank 0's check of the folder (a refusal ends rank 0,
    // and the group's watchdog the others), then take rank 0's weights.
    if (o.group) {
      o.group->barrier();
      dist::make_data_parallel(job_.workload, o.group);
    }
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
  // Generator states: "generator.<i>" and "default", each prefixed "rank<r>." in a data
  // parallel run (every rank draws its own augmentation).
  const std::string mine = world_ > 1 ? "rank" + std::to_string(rank_) + "." : "";
  for (const auto& [name, t] : c.rng) {
    if (name.compare(0, mine.size(), mine) != 0) continue;
    const std::string rest = name.substr(mine.size());
    if (rest == "default")
      resume_default_rng_ = t;
    else if (rest.rfind("generator.", 0) == 0)
      resume_rng_.push_back(t);
  }
  for (const auto& e : c.state.value("epochs", nlohmann::json::array()))
    history_.push_back(from_json(e));
  start_step_ = c.step;
  if (o.group) dist::make_data_parallel(job_.workload, o.group);  // the same weights everywhere
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
  ro.rank = rank_;
  ro.world_size = world_;
  const bool lead = rank_ == 0;
  dist::ProcessGroup* group = o.group.get();
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
    if (!lead) return;
    write_file_atomic(o.out_dir + "/metrics.jsonl", jsonl);
    write_file_atomic(o.out_dir + "/metrics.csv", csv);
  };

  if (start >= total) {  // the run was complete
    result.last_checkpoint = store.latest().value_or("");
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
  // lane) and stops the run at the first non-finite one — on every rank: in a data-parallel
  // run the ranks agree first (every rank calls this at the same steps), so none goes on alone
  // and rank 0 never saves weights another rank's loss spoiled.
  auto read_losses = [&]() {
    losses = runner.losses();
    for (; checked < losses.size() && nonfinite.empty(); ++checked)
      if (!std::isfinite(losses[checked])) {
        const int64_t g = start + static_cast<int64_t>(checked);
        nonfinite = "the loss of step " + std::to_string(g) + " (epoch " +
                    std::to_string(g / spe + 1) + ")" +
                    (world_ > 1 ? " on rank " + std::to_string(rank_) : std::string()) + " is " +
                    (std::isnan(losses[checked]) ? "NaN" : "infinite");
      }
    bool stop = !nonfinite.empty();
    if (group) stop = group->all_reduce_host({stop ? 1.0 : 0.0}, kMax)[0] > 0;
    if (!stop) return;
    if (nonfinite.empty()) nonfinite = "a loss on another rank is not finite";
    nonfinite += ": training stopped; the last good checkpoint, " +
                 (result.last_checkpoint.empty() ? std::string("none") : result.last_checkpoint) +
                 ", is kept (try a lower --lr)";
    throw NonFiniteLoss(nonfinite);
  };

  // A checkpoint of the state after `g` global steps; `item` = g - start.
  auto checkpoint = [&](int64_t g) {
    const auto t = Clock::now();
    read_losses();  // never save weights a non-finite loss produced
    Checkpoint c;
    c.step = g;
    c.model = models::state_dict(*job_.model);
    c.optimizer = optimizer->state();
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
      const std::string prefix = world_ > 1 ? "rank" + std::to_string(r) + "." : "";
      for (size_t i = 0; i + 1 < all[r].size(); ++i)
        c.rng.emplace_back(prefix + "generator." + std::to_string(i), all[r][i]);
      c.rng.emplace_back(prefix + "default", all[r].back());
    }
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
    if (group) r.train_loss = group->all_reduce_host({r.train_loss}, kMean)[0];
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
    // img/s counts every rank's images: the ranks run in lockstep.
    r.images_per_s *= world_;
    r.epoch_images_per_s *= world_;
    const auto t = Clock::now();
    if (job_.evaluate && lead) r.metrics = job_.evaluate(train_lane);
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
    // A stop, and (rank 0's clock) whether to report progress: alone, at every step; data
    // parallel, agreed by every rank every kAgreeEvery steps (a store round trip).
    int stop_now = o.stop ? o.stop->load() : 0;
    bool report = o.on_progress && seconds_since(last_progress) >= o.progress_seconds;
    if (group) {
      if (g % kAgreeEvery != 0) {
        stop_now = 0;
        report = false;
      } else {
        const std::vector<double> v =
            group->all_reduce_host({static_cast<double>(stop_now), report ? 1.0 : 0.0}, kMax);
        stop_now = static_cast<int>(v[0]);
        report = v[1] > 0;
      }
    }
    if (stop_now != 0) {
      if (last_saved != g) checkpoint(g);
      stopped = stop_now;
      throw StopRequested();
    }
    if (o.schedule) {
      lr_now = o.schedule(g);
      optimizer->set_lr(lr_now);
    }
    if (report) {
      last_progress = Clock::now();
      read_losses();
      if (!o.on_progress) return;
      TrainOptions::Progress p;
      p.epoch = g / spe;
      p.epochs = o.epochs;
      p.step_in_epoch = g % spe;
      p.steps_per_epoch = spe;
      p.step = g;
      p.total_steps = total;
      p.loss = losses.empty() ? 0 : losses.back();
      const double busy = seconds_since(run_start) - eval_seconds_total;
      p.images_per_s = busy > 0 ? static_cast<double>(item * o.batch_size * world_) / busy : 0;
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
  if (!lead) return result;
  result.weights = o.out_dir + "/model.safetensors";
  models::save_safetensors(result.weights, models::state_dict(*job_.model),
                           {{"format", "pt"}, {"job", job_.name}});
  return result;
}

}  // namespace tandem::train
