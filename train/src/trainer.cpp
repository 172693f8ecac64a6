// Trainer: epochs, evaluation, metrics, checkpoints, resume and signals over one Runner pass
// (see trainer.h for where each piece runs).
#include "tandem/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include "evaluation_thread.h"
#include "posix_fs.h"
#include "tandem/distributed/data_parallel.h"
#include "tandem/distributed/process_group.h"
#include "tandem/models/safetensors.h"
#include "tandem/runner.h"
#include "tandem/train/checkpoint.h"

namespace tandem::train {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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
  if (r.eval_images_per_s > 0) j["eval_images_per_s"] = r.eval_images_per_s;
  if (r.resumed_at_step >= 0) j["resumed_at_step"] = r.resumed_at_step;
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

// Thrown from the hook to end the run on a stop request (the runner wraps it in a RunError).
constexpr auto kMax = distributed::ProcessGroup::HostOp::kMax;
constexpr auto kMean = distributed::ProcessGroup::HostOp::kMean;

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
  struct sigaction sa {};
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
  TANDEM_CHECK_ARG(!o.out_dir.empty(), "no run folder given: expected --out RUN_DIR");
  TANDEM_CHECK_ARG(o.checkpoint_every >= 0, "checkpoint interval ", o.checkpoint_every,
                   " is not valid: expected >= 0 steps (0: at each epoch end)");
  if (!job_.weights) {
    TANDEM_CHECK_ARG(job_.model, "train job '", job_.name, "' has no model to save");
    job_.weights.state_dict = [model = job_.model] { return models::state_dict(*model); };
    job_.weights.load_state_dict = [model = job_.model](const models::NamedTensors& t) {
      models::load_state_dict(*model, t);
    };
  }
  const DataSource& data = job_.workload.data;
  TANDEM_CHECK_ARG(data.kind() == DataSource::Kind::kDataset && data.drop_last(), "train job '",
                   job_.name,
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
      const std::string diff = fingerprint_difference(saved_ids[key], data_ids_[key]);
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
  job_.workload.train.optimizer->load_state(c.optimizer);
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

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  const TrainOptions& o = options_;
  const int64_t spe = steps_per_epoch_;
  const int64_t total = o.epochs * spe;
  const int64_t start = start_step_;
  TrainResult result;
  result.epochs = history_;
  result.steps = start;
  result.resumed_from = resumed_ ? start : -1;
  result.notes = resume_notes_;
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
  ro.stop = o.stop;  // a step stuck waiting on a loader worker ends when a stop is requested
  ro.rank = rank_;
  ro.world_size = world_;
  const bool lead = rank_ == 0;
  distributed::ProcessGroup* group = o.group.get();
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
    if (!lead) return;
    write_file_atomic(o.out_dir + "/metrics.jsonl", jsonl);
    write_file_atomic(o.out_dir + "/metrics.csv", csv);
  };

  if (start >= total) {  // the run was complete
    result.last_checkpoint = resumed_folder_;
    result.weights =
        exists(o.out_dir + "/model.safetensors") ? o.out_dir + "/model.safetensors" : std::string();
    return result;
  }

  // A model tensor that is not finite before the first step (weights loaded with NaN): the loss
  // will not be finite either, and the learning rate is then not the cause to suggest.
  std::string bad_start;
  {
    at::NoGradGuard no_grad;
    std::vector<std::string> names;
    std::vector<at::Tensor> finite;
    for (const auto& [name, t] : job_.weights.state_dict())
      if (t.is_floating_point()) {
        names.push_back(name);
        finite.push_back(t.detach().isfinite().all());
      }
    if (!finite.empty()) {
      const at::Tensor ok = at::stack(finite).cpu();  // one synchronization
      for (size_t i = 0; i < names.size() && bad_start.empty(); ++i)
        if (!ok[static_cast<int64_t>(i)].item<bool>()) bad_start = names[i];
    }
  }
  std::string cause = "try a lower --lr";
  if (!bad_start.empty()) {
    const nlohmann::json w = job_.config.value("weights", nlohmann::json());
    const std::string weights = w.is_string() ? w.get<std::string>() : std::string();
    const std::string source = resumed_          ? "checkpoint " + resumed_folder_
                               : weights.empty() ? std::string("the job's model")
                                                 : "--weights " + weights;
    cause = "the starting weights (" + source + ") hold non-finite values (" + bad_start + ")";
  }

  runner.prepare(total - start);
  const int last = runner.num_stages() - 1;
  const Lane& train_lane = runner.train_lane();

  // Host-side bookkeeping, touched only by the train stage's thread (and after run()).
  std::vector<float> losses;   // this run's, read so far
  size_t checked = 0;          // losses[0, checked) are finite
  std::string nonfinite;       // set when a step's loss was not finite
  int64_t last_saved = start;  // the step of the newest checkpoint (the resumed one counts)
  result.last_checkpoint = resumed_folder_;
  double eval_seconds_total = 0;
  Clock::time_point run_start = Clock::now(), epoch_start = run_start, last_progress = run_start;
  double epoch_eval_excluded = 0;  // eval and checkpoint time inside the current epoch
  // The steady rate of an epoch is timed from its `steady_skip`-th step on: while the train
  // lane evaluates and checkpoints, the feed stages run ahead (up to the pipeline's depth), so
  // the first steps after an epoch boundary find their inputs already made and would count
  // work done during the pause. Past the depth the lead is what it is at the epoch's end.
  const int64_t steady_skip = std::min<int64_t>(runner.depth() + 2, spe / 2);
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
                 ", is kept (" + cause + ")";
    throw NonFiniteLoss(nonfinite);
  };

  // The running sums of the epoch that starts at global step `first`, after global step g (its
  // losses read): the checkpoint's carried ones first when the run resumed inside it, then this
  // run's in step order, so the loss sum is bitwise the uninterrupted run's. `seconds`: this
  // run's training time in it so far.
  auto epoch_sums = [&](int64_t first, int64_t g, double seconds) {
    EpochSums e = first < start ? carried_ : EpochSums{};
    const int64_t from = std::max(first, start) - start, to = g - start;
    for (int64_t i = from; i < to; ++i) e.loss_sum += losses[static_cast<size_t>(i)];
    e.steps += to - from;
    e.seconds += seconds;
    e.images += (to - from) * o.batch_size * world_;
    return e;
  };

  // A checkpoint of the state after `g` global steps; `item` = g - start.
  auto checkpoint = [&](int64_t g) {
    const auto t = Clock::now();
    read_losses();  // never save weights a non-finite loss produced
    // Inside an epoch: its running sums, every rank's loss sum (gathered to rank 0 in rank
    // order; each rank's mean goes into the record's mean over the ranks).
    std::optional<EpochSums> sums;
    std::vector<double> loss_sums;
    if (g % spe != 0) {
      sums =
          epoch_sums(g - g % spe, g,
                     std::chrono::duration<double>(t - epoch_start).count() - epoch_eval_excluded);
      loss_sums = {sums->loss_sum};
      if (group) {
        std::vector<uint8_t> bytes(sizeof(double));
        std::memcpy(bytes.data(), &sums->loss_sum, sizeof(double));
        loss_sums.clear();
        for (const auto& theirs : group->all_gather_host(bytes)) {
          double v = 0;
          std::memcpy(&v, theirs.data(), sizeof v);
          loss_sums.push_back(v);
        }
      }
    }
    Checkpoint c;
    c.step = g;
    c.model = job_.weights.state_dict();
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
    c.state = {{"config", job_.config},    {"data_fingerprints", data_ids_}, {"epoch", g / spe},
               {"step_in_epoch", g % spe}, {"steps_per_epoch", spe},         {"epochs", history}};
    if (job_.save_state) c.state["job_state"] = job_.save_state();
    if (sums)
      c.state["epoch_so_far"] = {{"steps", sums->steps},
                                 {"loss_sums", loss_sums},
                                 {"seconds", sums->seconds},
                                 {"images", sums->images}};
    result.last_checkpoint = store.save(c);
    last_saved = g;
    epoch_eval_excluded += seconds_since(t);
    if (steady_marked) steady_excluded += seconds_since(t);
  };

  // The end of the epoch that finishes at global step g: evaluate, record, checkpoint.
  detail::EvaluationThread evaluations;  // every evaluation on one thread (why: its header)
  auto end_epoch = [&](int64_t g) {
    read_losses();
    const EpochSums e = epoch_sums(g - spe, g, seconds_since(epoch_start) - epoch_eval_excluded);
    EpochRecord r;
    r.epoch = g / spe;
    r.step = g;
    if (g - spe < start && resumed_) r.resumed_at_step = start;
    r.train_loss = e.steps > 0 ? e.loss_sum / static_cast<double>(e.steps) : 0;
    if (group) r.train_loss = group->all_reduce_host({r.train_loss}, kMean)[0];
    r.lr = lr_now;
    r.train_seconds = e.seconds;
    // img/s counts every rank's images: the ranks run in lockstep.
    r.epoch_images_per_s = e.seconds > 0 ? static_cast<double>(e.images) / e.seconds : 0;
    const double steady_seconds = seconds_since(steady_t) - steady_excluded;
    r.images_per_s =
        steady_marked && g > steady_from && steady_seconds > 0
            ? static_cast<double>((g - steady_from) * o.batch_size * world_) / steady_seconds
            : r.epoch_images_per_s;
    steady_marked = false;
    const auto t = Clock::now();
    int64_t scored = 0;
    if (job_.evaluate && lead) {
      // The evaluation's loader gets the cores: the training's workers wait at their next
      // sample until it is done (resumed even if it throws).
      runner.pause_loading(true);
      struct Resume {
        Runner& r;
        ~Resume() { r.pause_loading(false); }
      } resume{runner};
      Evaluation ev =
          evaluations.run<Evaluation>(train_lane, [&] { return job_.evaluate(train_lane); });
      r.metrics = std::move(ev.metrics);
      scored = ev.samples;
    }
    r.eval_seconds = seconds_since(t);
    if (scored > 0 && r.eval_seconds > 0)
      r.eval_images_per_s = static_cast<double>(scored) / r.eval_seconds;
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
    // A stop requested while a step waited on a stuck loader worker: the loader gave up, and
    // the run ends as a stop does, keeping its last checkpoint.
    if (stopped == 0 && o.stop && o.stop->load() != 0) stopped = o.stop->load();
    if (stopped == 0) throw;
    result.stopped_by_signal = stopped;
    result.steps = last_saved;
    result.losses = losses;
    for (const auto& n : runner.notes()) result.notes.push_back(n);
    return result;
  }
  // The last epoch's end: after run(), the current stream has waited for every lane.
  end_epoch(total);
  result.steps = total;
  result.losses = runner.losses();
  result.skipped = runner.skipped();
  for (const auto& n : runner.notes()) result.notes.push_back(n);
  if (!lead) return result;
  result.weights = o.out_dir + "/model.safetensors";
  models::save_safetensors(result.weights, job_.weights.state_dict(),
                           {{"format", "pt"}, {"job", job_.name}});
  return result;
}

}  // namespace tandem::train
