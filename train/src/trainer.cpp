// Trainer: building one (its options and run folder checked) and resuming it from its newest
// valid checkpoint; train_pass.cpp trains it (see trainer.h for where each piece runs).
#include "tandem/train/trainer.h"

#include <algorithm>
#include <csignal>
#include <iostream>
#include <optional>
#include <utility>

#include "loader_workers.h"
#include "posix_fs.h"
#include "tandem/distributed/data_parallel.h"
#include "tandem/distributed/process_group.h"
#include "tandem/models/safetensors.h"
#include "tandem/train/checkpoint.h"

namespace tandem::train {

namespace {

using fs::exists;
using fs::is_dir;

// The newest checkpoint in `dir` that loads whole (CheckpointStore::load checks it), with its
// folder; a newer damaged one is skipped with a note saying why. None when `dir` holds none;
// tandem::Error naming each when every one is damaged (starting over would, checkpoint by
// checkpoint, replace what someone may still repair).
std::optional<std::pair<Checkpoint, std::string>> newest_valid_checkpoint(
    const std::string& dir, std::vector<std::string>& notes) {
  if (!exists(dir)) return std::nullopt;  // checked first: a store would make the folder
  const std::vector<std::string> all = CheckpointStore(dir, 1).list();
  std::vector<std::string> skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      Checkpoint c = CheckpointStore::load(*it);
      for (const auto& s : skipped)
        notes.push_back("--resume: skipped checkpoint " + s + "; resuming from " + *it);
      return std::make_pair(std::move(c), *it);
    } catch (const std::exception& e) {
      skipped.push_back(*it + ": " + e.what());
    }
  }
  if (all.empty()) return std::nullopt;
  std::string list;
  for (const auto& s : skipped) list += (list.empty() ? "" : "; ") + s;
  throw Error("--resume: no checkpoint in " + dir + " loads (" + list +
              "): expected at least one whole; move the folder aside to start the run over");
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
  if (r.eval_images_per_s > 0) j["eval_images_per_s"] = r.eval_images_per_s;
  if (r.resumed_at_step >= 0) j["resumed_at_step"] = r.resumed_at_step;
  for (const auto& [k, v] : r.metrics) j[k] = v;
  return j;
}

nlohmann::json to_json(const RunSetup& s) {
  return {{"prepare_s", s.prepare_seconds},
          {"capture_s", s.capture_seconds},
          {"graphs", s.graphs},
          {"graphs_kept", s.graphs_kept}};
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
  r.eval_images_per_s = j.value("eval_images_per_s", 0.0);
  r.resumed_at_step = j.value("resumed_at_step", int64_t{-1});
  static const char* kFixed[] = {"epoch",           "step",
                                 "train_loss",      "lr",
                                 "images_per_s",    "epoch_images_per_s",
                                 "train_seconds",   "eval_seconds",
                                 "resumed_at_step", "eval_images_per_s"};
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
             (saved.contains(k) ? saved.at(k).dump() : std::string("(none)")) + ", now " + v.dump();
  for (const auto& [k, v] : saved.items())
    if (!now.contains(k))
      out += (out.empty() ? "" : ", ") + k + ": checkpoint " + v.dump() + ", now (none)";
  return out;
}

std::atomic<int>* g_stop_flag = nullptr;
// Async-signal-safe: one lock-free atomic store. SA_RESETHAND (below) makes a second signal of
// the kind take the default action, so a second Ctrl-C kills a stop that hangs.
extern "C" void on_stop_signal(int sig) {
  if (g_stop_flag) {
    int expected = 0;
    g_stop_flag->compare_exchange_strong(expected, sig);
  }
}

/// The options with their loader worker count resolved: 0 is every front end's rule for the
/// job's device (distributed::default_loader_workers).
TrainOptions with_loader_workers(TrainOptions o, const TrainJob& job) {
  o.workers = loader_workers(o.workers, job.workload.device);
  return o;
}

/// A job whose loaders and evaluation were built for another batch size or worker count than
/// the run's would evaluate (and feed the engines) at those: refused, naming both.
void check_built_for(const TrainJob& job, const TrainOptions& o) {
  const bool batch_differs =
      job.built_for_batch_size > 0 && job.built_for_batch_size != o.batch_size;
  const bool workers_differ = job.built_for_workers > 0 && job.built_for_workers != o.workers;
  TANDEM_CHECK_ARG(!batch_differs && !workers_differ, "train job '", job.name,
                   "' was built for batch size ", job.built_for_batch_size, " and ",
                   job.built_for_workers, " loader workers (ClassifierOptions), the run asks ",
                   o.batch_size, " and ", o.workers, " (TrainOptions): expected the same in both");
}

/// Names the first option not valid (InvalidArgument), or one a run folder's run cannot take
/// (steps, a first step) or one without a folder cannot (resume, checkpoints).
void check_options(const TrainOptions& o) {
  const bool folder = !o.out_dir.empty();
  TANDEM_CHECK_ARG(o.steps >= 0, "steps ", o.steps, " is not valid: expected >= 1 (0: epochs)");
  TANDEM_CHECK_ARG(o.steps > 0 || o.epochs >= 1, "epochs ", o.epochs,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(o.batch_size >= 1, "batch size ", o.batch_size, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(o.checkpoint_every >= 0, "checkpoint interval ", o.checkpoint_every,
                   " is not valid: expected >= 0 steps (0: at each epoch end)");
  TANDEM_CHECK_ARG(o.first_step >= 0, "first step ", o.first_step, " is not valid: expected >= 0");
  if (folder) {
    TANDEM_CHECK_ARG(o.steps == 0, "a run folder's run trains whole epochs: expected epochs, not ",
                     o.steps, " steps");
    TANDEM_CHECK_ARG(o.first_step == 0,
                     "a run folder's run starts where its checkpoint is: "
                     "expected resume, not a first step of ",
                     o.first_step);
  } else {
    TANDEM_CHECK_ARG(!o.resume,
                     "resume continues a run folder's run: expected a run folder "
                     "(--out RUN_DIR)");
    TANDEM_CHECK_ARG(o.checkpoint_every == 0, "checkpoints every ", o.checkpoint_every,
                     " steps go into a run folder: expected a run folder (--out RUN_DIR)");
  }
}

}  // namespace

void install_stop_handlers(std::atomic<int>* flag) {
  g_stop_flag = flag;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // a second signal of the kind kills
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

Trainer::Trainer(TrainJob job, TrainOptions options)
    : job_(std::move(job)), options_(with_loader_workers(std::move(options), job_)) {
  const TrainOptions& o = options_;
  const bool folder = !o.out_dir.empty();
  check_options(o);
  check_built_for(job_, o);
  keeps_epochs_ = folder || static_cast<bool>(job_.evaluate);
  if (!job_.weights && (folder || job_.model)) {
    TANDEM_CHECK_ARG(job_.model, "train job '", job_.name, "' has no model to save");
    job_.weights.state_dict = [model = job_.model] { return models::state_dict(*model); };
    job_.weights.load_state_dict = [model = job_.model](const models::NamedTensors& t) {
      models::load_state_dict(*model, t);
    };
  }
  const DataSource& data = job_.workload.data;
  TANDEM_CHECK_ARG(!folder || (data.kind() == DataSource::Kind::kDataset && data.drop_last()),
                   "train job '", job_.name,
                   "': expected a dataset source with drop_last (DataSource::from_dataset)");
  if (o.group) {
    world_ = o.group->world_size();
    rank_ = o.group->rank();
  }
  const bool lead = rank_ == 0;
  steps_per_epoch_ = data.batches_per_epoch(o.batch_size, world_);
  TANDEM_CHECK_ARG(
      steps_per_epoch_ >= 1 || !(keeps_epochs_ || o.steps == 0), "train job '", job_.name, "': ",
      data.kind() == DataSource::Kind::kDataset
          ? detail::concat("the training set (", detail::count_of(data.dataset()->size(), "sample"),
                           ") makes no full batch of ", o.batch_size,
                           ": expected a smaller --batch-size")
          : std::string("its data has no epochs (not a dataset source): expected a length in "
                        "steps and no evaluation"));
  start_step_ = o.first_step;
  if (!folder) {  // nothing to check, write or resume
    if (o.group) distributed::make_data_parallel(job_.workload, o.group);
    return;
  }
  job_.config["batch_size"] = o.batch_size;
  job_.config["epochs"] = o.epochs;
  job_.config["seed"] = o.seed;
  if (world_ > 1) job_.config["world_size"] = world_;

  // The data's identity, saved with every checkpoint (rank 0 alone writes and checks them).
  data_ids_ = nlohmann::json::object();
  if (lead)
    for (const char* key : {"data", "val"}) {
      const nlohmann::json v = job_.config.value(key, nlohmann::json());
      if (v.is_string() && !v.get<std::string>().empty() && is_dir(v.get<std::string>()))
        data_ids_[key] = fingerprint_data(v.get<std::string>());
    }

  if (o.resume) {
    auto found = newest_valid_checkpoint(o.out_dir + "/checkpoints", resume_notes_);
    if (found) {
      load_checkpoint(found->first, found->second);
      if (lead)
        for (const auto& n : resume_notes_) std::cerr << n << "\n";
      if (o.group) distributed::make_data_parallel(job_.workload, o.group);  // the same weights
      return;
    }
    // A run that failed before its first checkpoint (or a new folder): nothing to continue.
    resume_notes_.push_back(
        "--resume: no checkpoint in " + o.out_dir + "/checkpoints: starting the run from step 0" +
        (fs::is_non_empty_dir(o.out_dir) ? " (its metrics files are rewritten)" : ""));
    if (lead) std::cerr << resume_notes_.back() << "\n";
  }
  if (lead) {
    TANDEM_CHECK_ARG(o.resume || !fs::is_non_empty_dir(o.out_dir), "run folder ", o.out_dir,
                     " already exists and is not empty: add --resume to continue it (from its "
                     "newest checkpoint, or from step 0 when it has none), or choose another "
                     "--out (nothing is overwritten)");
    make_dirs(o.out_dir);
    write_file_atomic(o.out_dir + "/config.json", job_.config.dump(2) + "\n");
  }
  // Data parallel: the others wait for rank 0's check of the folder (a refusal ends rank 0,
  // and the group's watchdog the others), then take rank 0's weights.
  if (o.group) {
    o.group->barrier();
    distributed::make_data_parallel(job_.workload, o.group);
  }
}

void Trainer::load_checkpoint(const Checkpoint& c, const std::string& folder) {
  const bool lead = rank_ == 0;
  const nlohmann::json& st = c.state;
  const int format = st.value("format", 1);
  nlohmann::json saved = st.value("config", nlohmann::json::object());
  // The data is compared by content where the checkpoint holds its fingerprint (rank 0 checks;
  // the others take its word), else (format 1) by the resolved path: format 1 stored the path
  // as spelled, relative to the working folder of the day.
  const nlohmann::json saved_ids = st.value("data_fingerprints", nlohmann::json::object());
  for (const char* key : {"data", "val", "weights"}) {
    if (!saved.contains(key) || !saved[key].is_string() || !job_.config.contains(key)) continue;
    const nlohmann::json& now_value = job_.config[key];
    const std::string was = saved[key].get<std::string>(),
                      now = now_value.is_string() ? now_value.get<std::string>() : now_value.dump();
    if (!saved_ids.contains(key)) {
      if (format < 2) saved[key] = resolve_path(was);
      continue;
    }
    if (lead) {
      TANDEM_CHECK_ARG(data_ids_.contains(key), "--resume: checkpoint ", folder,
                       " was trained on the folder ", was, ": --", key, " ", now,
                       " is not a folder now");
      // A fingerprint made before IDX files were identified by their content: compared as made.
      const nlohmann::json now_id =
          saved_ids[key].value("idx", "") == "content"
              ? data_ids_[key]
              : fingerprint_data(job_.config[key].get<std::string>(), IdxIdentity::kFileBytes);
      const std::string diff = fingerprint_difference(saved_ids[key], now_id);
      TANDEM_CHECK_ARG(diff.empty(), "--resume: checkpoint ", folder,
                       " was trained on other data than --", key, " ", now,
                       " (the checkpoint's: ", was, "): ", diff, ": expected the same files");
      if (saved[key] != job_.config[key])
        resume_notes_.push_back(std::string("--resume: the ") + key + " folder is now " + now +
                                ", the checkpoint's was " + was + ": the same " +
                                data_ids_[key]["files"].dump() + " files, resuming");
    }
    saved[key] = job_.config[key];
  }
  if (format < 2)
    resume_notes_.push_back("--resume: checkpoint " + folder +
                            " is of format 1: its data was matched by path only, not by content");
  const std::string diff = config_difference(saved, job_.config);
  TANDEM_CHECK_ARG(diff.empty(), "--resume: checkpoint ", folder,
                   " was made by another configuration (", diff,
                   "): expected the same model, data and settings");
  const int64_t spe = steps_per_epoch_;
  TANDEM_CHECK_ARG(st.value("steps_per_epoch", spe) == spe, "--resume: checkpoint ", folder,
                   " has epochs of ", st.value("steps_per_epoch", spe), " steps, this run ", spe,
                   ": expected the same training set and batch size");
  job_.weights.load_state_dict(c.model);
  {  // the loss scale's entries (kLossScalePrefix) apart from the optimizer's
    std::vector<std::pair<std::string, at::Tensor>> optimizer, scale;
    for (const auto& [name, tensor] : c.optimizer) {
      const bool scales = name.rfind(kLossScalePrefix, 0) == 0;
      (scales ? scale : optimizer)
          .emplace_back(scales ? name.substr(std::string(kLossScalePrefix).size()) : name, tensor);
    }
    job_.workload.train.optimizer->load_state(optimizer);
    if (const auto& loss_scale = job_.workload.train.loss_scale) loss_scale->load_state(scale);
  }
  if (job_.load_state && st.contains("job_state")) job_.load_state(st["job_state"]);
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
  for (const auto& e : st.value("epochs", nlohmann::json::array()))
    history_.push_back(from_json(e));
  start_step_ = c.step;
  resumed_ = true;
  resumed_folder_ = folder;
  // Inside an epoch: what its steps before the checkpoint summed to, so its record is whole.
  const int64_t in_epoch = c.step % spe;
  if (in_epoch == 0) return;
  if (!st.contains("epoch_so_far")) {
    resume_notes_.push_back(
        "--resume: checkpoint " + folder + " (format 1) holds no running sums of epoch " +
        std::to_string(c.step / spe + 1) + ": its train_loss and train_seconds cover steps " +
        std::to_string(c.step) + " on only");
    return;
  }
  const nlohmann::json& e = st["epoch_so_far"];
  const nlohmann::json& sums = e.at("loss_sums");
  if (e.at("steps").get<int64_t>() != in_epoch || !sums.is_array() ||
      sums.size() != static_cast<size_t>(world_))
    throw Error("--resume: checkpoint " + folder + "/state.json: its epoch_so_far " + e.dump() +
                " does not fit step " + std::to_string(c.step) + " of " + std::to_string(world_) +
                " rank(s): expected " + std::to_string(in_epoch) + " steps and a sum per rank");
  carried_.steps = in_epoch;
  carried_.loss_sum = sums.at(static_cast<size_t>(rank_)).get<double>();
  carried_.seconds = e.at("seconds").get<double>();
  carried_.images = e.at("images").get<int64_t>();
}

void Trainer::set_next_run(TrainOptions given) {
  TrainOptions options = with_loader_workers(std::move(given), job_);
  const TrainOptions& now = options_;
  TANDEM_CHECK_ARG(now.out_dir.empty() && options.out_dir.empty(),
                   "a run folder's run is one run: expected runs without a run folder");
  TANDEM_CHECK_ARG(options.mode == now.mode && options.batch_size == now.batch_size &&
                       options.workers == now.workers && options.seed == now.seed &&
                       options.skip_bad == now.skip_bad && options.group == now.group,
                   "train job '", job_.name, "': a next run keeps the Runner built for mode ",
                   to_string(now.mode), ", batch size ", now.batch_size, ", ", now.workers,
                   " workers, seed ", now.seed,
                   ": expected the same (and the same skip_bad and group), got mode ",
                   to_string(options.mode), ", batch size ", options.batch_size, ", ",
                   options.workers, " workers, seed ", options.seed);
  check_options(options);
  start_step_ = options.first_step;
  options_ = std::move(options);
}

Trainer::~Trainer() = default;

}  // namespace tandem::train
