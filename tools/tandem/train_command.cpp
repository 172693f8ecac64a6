// `tandem train`: flags -> ClassifierOptions + TrainOptions, then the Trainer; progress, table,
// JSON. See train_command.h.
#include "train_command.h"

#include <ATen/Context.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "conv_plans_report.h"
#include "data_parallel.h"
#include "tandem/cuda_wait.h"
#include "tandem/data/shrink.h"
#include "tandem/detail/lane.h"
#include "tandem/detail/thread_sched.h"  // kMaxNice
#include "tandem/error.h"
#include "tandem/loader.h"  // kMaxLoaderWorkers
#include "tandem/mode.h"
#include "tandem/models/resnet.h"
#include "tandem/models/safetensors.h"
#include "tandem/run/report.h"  // device_name
#include "tandem/run/resolve_mode.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/report.h"
#include "tandem/train/trainer.h"

namespace tandem {

namespace {

// Every model make_classifier builds: the small CNN and the ResNets (classifier.cpp), and an FCN
// over each of those ResNets, "fcn_" + its name (segmenter.cpp); auto picks one by the data.
std::vector<std::string> model_choices() {
  std::vector<std::string> names{"auto", "small_cnn"};
  const std::vector<std::string> resnets = models::resnet_names();
  names.insert(names.end(), resnets.begin(), resnets.end());
  for (const auto& r : resnets) names.push_back("fcn_" + r);
  return names;
}

// The modes the Trainer runs: every workload mode a run folder allows (run::mode_problem:
// graphed_k's K steps per replay would cut through its per-step schedule, checkpoints and
// progress; tandem's optimizers are capturable and read their lr from the device).
std::vector<run::RunMode> train_modes() {
  run::ModeConstraints run_folder;
  run_folder.run_folder = true;
  std::vector<run::RunMode> modes;
  for (const Mode m : workload_modes())
    if (run::mode_problem(m, run_folder).empty()) modes.push_back(m);
  return modes;
}

// tandem train's default: the mode by the device (run::resolve_mode_by_device), a behaviour
// with a name of its own. "auto" is the timed trials tandem bench and the Python Trainer run,
// which a run of epochs in one mode does not pay for: the device settles the choice.
constexpr const char* kByDevice = "by-device";

// --mode's check: a mode of train_modes() or by-device; auto refused with why.
CLI::Validator train_mode_validator() {
  std::vector<std::string> names = cli::mode_names(train_modes());
  names.emplace_back(kByDevice);
  const CLI::Validator named = cli::choice_validator("mode", names);
  const std::string expected = join_choices(names);
  return CLI::Validator(
      [named, expected](std::string& value) {
        if (value == "auto")
          return "mode 'auto' (timed trials of the modes: tandem bench's and the Python "
                 "Trainer's) is not one of tandem train's, whose epochs run one mode: " +
                 std::string(kByDevice) + " (the default) picks it from the device; expected " +
                 expected;
        std::string v = value;
        return named(v);
      },
      "");
}

// The smallest --image-size: the ResNets' output stride. A smaller square reaches layer4 (and
// the FCN's head) as less than one cell a side.
constexpr int64_t kMinImageSize = 32;

}  // namespace

bool TrainCommand::given(const char* flag) const { return app_->get_option(flag)->count() > 0; }

CLI::App* TrainCommand::add(CLI::App& app) {
  CLI::App* c = app_ = app.add_subcommand(
      "train",
      "Train a model on your images and keep the weights: IDX files (MNIST / Fashion-MNIST: the "
      "small CNN), an ImageFolder (one subfolder per class: ResNet-18/34/50, optionally a "
      "frozen backbone) or image + mask pairs (images/ and masks/: an FCN over a ResNet, "
      "--classes N), with an evaluation after each epoch (accuracy, or mIoU), metrics "
      "(RUN_DIR/metrics.jsonl, .csv), atomic checkpoints, --resume, and bf16.");
  c->footer(
      "Exit codes: 0 success, 1 the run failed, 2 bad command-line input, 130 stopped by SIGINT\n"
      "(Ctrl-C) and 143 by SIGTERM, each after the step in flight and a checkpoint: --resume\n"
      "continues. TANDEM_DEBUG=1 prints whole error messages and LibTorch's warnings.");
  c->add_option("--data", job.data,
                "training data: a folder of IDX files (train-images-idx3-ubyte[.gz], ...), an "
                "ImageFolder, or images/ + masks/ (segmentation)")
      ->required();
  auto* val = c->add_option("--val", job.val,
                            "held-out data of the same kind [default: an IDX folder's t10k "
                            "files; none for an ImageFolder unless --val-split]");
  c->add_option("--val-split", job.val_split,
                "ImageFolder: hold out this fraction of --data (every k-th file) for evaluation")
      ->excludes(val);
  const std::vector<std::string> models = model_choices();
  c->add_option("--model", job.model,
                join_choices(models) +
                    " (auto: small_cnn for IDX, fcn_resnet18 for image + mask "
                    "pairs, resnet18 for an ImageFolder)")
      ->check(cli::choice_validator("model", models))
      ->capture_default_str();
  c->add_option("--weights", job.weights,
                "start from these weights (safetensors, torchvision's names: "
                "safetensors.torch.save_file(model.state_dict(), F)); a head of another class "
                "count starts fresh");
  c->add_option("--classes", job.classes,
                "segmentation: the class count, >= 2 (mask ids 0 .. N-1)");
  c->add_option("--ignore-index", job.ignore_index,
                "segmentation: the mask id that no loss or metric counts")
      ->capture_default_str();
  c->add_option("--freeze", freeze, "backbone: train only the classifier head (ResNets)")
      ->check(CLI::IsMember({"backbone"}));
  c->add_option("--epochs", epochs, "epochs to train")->capture_default_str();
  c->add_option("--batch-size", batch_size,
                "samples per step [default: small_cnn 128; ResNets 256 on a GPU, 16 on the CPU]");
  c->add_option("--optimizer", job.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  c->add_option("--lr", job.lr, "peak learning rate [default: adamw 1e-3, sgd 0.1]");
  c->add_option("--momentum", job.momentum, "sgd's momentum")->capture_default_str();
  c->add_option("--weight-decay", job.weight_decay, "[default: adamw 1e-2, sgd 5e-4]");
  c->add_option("--schedule", schedule,
                "learning rate per step: cosine (to 0 at the end), step (x gamma every "
                "--step-epochs), constant")
      ->check(CLI::IsMember({"cosine", "step", "constant"}))
      ->capture_default_str();
  c->add_option("--warmup-epochs", warmup_epochs, "linear warm-up into the schedule (epochs)")
      ->capture_default_str();
  c->add_option("--step-epochs", step_epochs,
                "--schedule step: epochs between decays "
                "[default: a third of --epochs]");
  c->add_option("--gamma", gamma, "--schedule step: the decay factor")->capture_default_str();
  c->add_option("--precision", precision,
                "fp32, bf16 (autocast in every mode, fp32 master weights) or fp16 (the same with "
                "a dynamic loss scale; on a GPU the ResNets' batch norms take their statistics "
                "from the convolutions' epilogues, faster than bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  const auto by_device = [](c10::DeviceType type) {
    return std::string(
        to_string(run::resolve_mode_by_device(std::nullopt, c10::Device(type)).mode));
  };
  const std::string by_device_help =
      by_device(c10::kCUDA) + " on a GPU, " + by_device(c10::kCPU) + " on the CPU";
  c->add_option("--mode", mode,
                "how steps run:" + cli::mode_help(train_modes()) +
                    cli::mode_help_line(kByDevice, by_device_help))
      ->check(train_mode_validator())
      ->capture_default_str();
  c->add_option("--device", device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  c->add_option("--workers", workers, run::kLoaderWorkersHelp);
  c->add_option("--worker-nice", job.worker_nice,
                "the loader threads' nice value, 0 to 19: above 0 they run below the run's own "
                "threads (the JPEG engines' feed, the step's launches), which then get a core "
                "first when the loader fills every core")
      ->capture_default_str();
  c->add_option("--cuda-wait", cuda_wait,
                "how the run's threads wait for the GPU: auto (CUDA's choice: they spin, holding "
                "a core), spin, yield, or block (they sleep until the work is done, leaving the "
                "cores to the loader's threads)")
      ->check(CLI::IsMember(cuda_wait_names()))
      ->capture_default_str();
  c->add_option("--image-size", job.image_size,
                "ImageFolder and segmentation: the square the model sees, >= " +
                    std::to_string(kMinImageSize) + " [default: 224; segmentation on the CPU 128]");
  c->add_option("--crop", crop,
                "ImageFolder training: region (each sample's random crop drawn first and only "
                "that box decoded, at the scale that keeps it at --image-size: torchvision's "
                "crop of the full-resolution photo, never a small box enlarged; with libjpeg's "
                "API it decodes more images per core than whole, without it about half as "
                "many) or whole (each image decoded whole at the scale --image-size needs, the "
                "random crop cut on the GPU from that reduced image)")
      ->check(CLI::IsMember({"region", "whole"}))
      ->capture_default_str();
  c->add_option("--decode", decode,
                "ImageFolder training with --crop region on a GPU: auto (each batch split "
                "between the loader's workers and the GPU's JPEG engines: a short trial sets "
                "the engines' share, the run's own rates then move it; the workers alone for "
                "photos one core decodes faster than 600 a second, where there are no engines, "
                "or with --deterministic unless --engine-share is given) or cpu (the workers "
                "alone)")
      ->check(CLI::IsMember({"cpu", "auto"}))
      ->capture_default_str();
  c->add_option("--engine-share", job.engine_share,
                "with --decode auto: the JPEG engines' fixed share of each batch, 0 to 1 [default: "
                "measured, and following the rates]")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--subset", job.subset, "train on this many samples (spread over the set)");
  c->add_option("--val-subset", job.val_subset, "evaluate on this many samples");
  c->add_option("--eval-cache-mb", eval_cache_mb,
                "ImageFolder evaluation: keep the held-out photos as the first evaluation decoded "
                "them (center crops) in host memory, up to this many MiB, so later evaluations "
                "decode only what did not fit; 0: decode at every evaluation [default: a quarter "
                "of this machine's memory, shared by its ranks]");
  c->add_option("--seed", seed, "seed for weights, data order and augmentation")
      ->capture_default_str();
  c->add_option("--out", out, "the run folder: metrics, checkpoints, model.safetensors")
      ->required();
  c->add_flag("--resume", resume,
              "continue the run in --out from its newest checkpoint (same settings; none yet: "
              "start it). A worker torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0) resumes "
              "without it");
  c->add_option("--checkpoint-every", checkpoint_every,
                "also checkpoint every N steps [default: 0, at each epoch end only]");
  c->add_option("--keep", keep, "checkpoints kept")->capture_default_str();
  c->add_flag("--skip-bad", skip_bad, "leave files that fail to load out and report them");
  c->add_flag("--deterministic", deterministic,
              "deterministic algorithms (cuDNN autotuning off): a resumed run repeats the "
              "losses; slower");
  c->add_flag("--tf32,!--no-tf32", tf32, "TF32 matmuls and convolutions in fp32 [default: on]");
  c->add_flag("--channels-last,!--no-channels-last", channels_last,
              "ResNets: weights and inputs channels-last (NHWC), tensor-core convolutions without "
              "transposes [default: on with a GPU]");
  c->add_option("--json", json, "write a summary (per-epoch rows) as JSON to this file");
  c->add_flag("--quiet", quiet, "no progress line");
  c->add_option("--nproc", nproc,
                "data parallel on this machine: N ranks, one per GPU (or N CPU processes with "
                "--device cpu); --batch-size is per rank; rank 0 writes the run folder. torchrun "
                "--nproc-per-node N --no-python tandem train ... does the same");
  timeouts.add(c);
  return c;
}

void TrainCommand::validate() const {
  // One rule per numeric flag. A rule is checked only when its flag was given: a default is
  // valid, or stands for "by model, data or device" (--batch-size, --lr, --workers, ...), so a
  // given value never falls back to it silently. --ignore-index takes any integer: CLI11's
  // conversion (one line naming the flag for "abc") is its whole check.
  const auto finite = [](double v) { return std::isfinite(v); };
  // CLI11 converts "-1" to an unsigned seed as 2^64 - 1: the text is what says it was negative.
  const bool negative_seed =
      given("--seed") && app_->get_option("--seed")->results().back()[0] == '-';
  struct Rule {
    const char* flag;
    bool ok;
    std::string expected;
  };
  const Rule rules[] = {
      {"--epochs", epochs >= 1, "an integer >= 1"},
      {"--batch-size", batch_size >= 1,
       "an integer >= 1 (leave --batch-size out for the model's default)"},
      {"--lr", finite(job.lr) && job.lr > 0, "a finite number > 0"},
      {"--momentum", finite(job.momentum) && job.momentum >= 0 && job.momentum < 1,
       "a finite number in [0, 1)"},
      {"--weight-decay", finite(job.weight_decay) && job.weight_decay >= 0, "a finite number >= 0"},
      {"--warmup-epochs",
       finite(warmup_epochs) && warmup_epochs >= 0 && warmup_epochs < static_cast<double>(epochs),
       detail::concat("a finite number >= 0 and less than --epochs (", epochs, ")")},
      {"--step-epochs", step_epochs >= 1, "an integer >= 1"},
      {"--gamma", finite(gamma) && gamma > 0 && gamma <= 1, "a finite number in (0, 1]"},
      {"--workers", workers >= 1 && workers <= kMaxLoaderWorkers,
       detail::concat("an integer from 1 to ", kMaxLoaderWorkers)},
      {"--worker-nice", job.worker_nice >= 0 && job.worker_nice <= kMaxNice,
       detail::concat("an integer from 0 to ", kMaxNice, " (0: the process's priority)")},
      {"--image-size", job.image_size >= kMinImageSize,
       detail::concat("an integer >= ", kMinImageSize, " (the ResNets' output stride)")},
      {"--subset", job.subset >= 1, "an integer >= 1"},
      {"--val-subset", job.val_subset >= 1, "an integer >= 1"},
      {"--eval-cache-mb", eval_cache_mb >= 0 && eval_cache_mb <= (int64_t{1} << 40),
       "an integer >= 0 (MiB; 0: no cache)"},
      {"--val-split", finite(job.val_split) && job.val_split > 0 && job.val_split < 1,
       "a fraction in (0, 1)"},
      {"--classes", job.classes >= 2, "an integer >= 2 (mask ids 0 .. N-1)"},
      {"--checkpoint-every", checkpoint_every >= 0,
       "an integer >= 0 (steps; 0: at each epoch end only)"},
      {"--keep", keep >= 1, "an integer >= 1"},
      {"--nproc", nproc >= 1, "an integer >= 1"},
      {"--seed", !negative_seed, "an integer >= 0"},
      {"--engine-share", finite(job.engine_share) && job.engine_share >= 0 && job.engine_share <= 1,
       "a finite number from 0 to 1 (leave it out for a measured share)"},
  };
  for (const Rule& r : rules)
    if (given(r.flag) && !r.ok)
      throw InvalidArgument(detail::concat(r.flag, " ", app_->get_option(r.flag)->results().back(),
                                           " is not valid: expected ", r.expected));

  try {
    parse_device(device);
  } catch (const InvalidArgument& e) {  // "device 'tpu' is not valid: expected auto, cpu, ..."
    throw InvalidArgument(std::string("--device: ") + e.what());
  }
  cli::check_output_folder("--out", out);
  if (!json.empty()) {
    // A summary written into the run folder itself (scripts/run.sh does) needs only that folder,
    // which the run makes, to be usable; anywhere else its folder must exist now.
    auto strip = [](std::string p) {
      while (p.size() > 1 && p.back() == '/') p.pop_back();
      return p;
    };
    if (strip(fs::parent_of(json)) == strip(out))
      cli::check_output_folder("--json", out);
    else
      cli::check_output_file("--json", json);
  }
  if (!job.weights.empty()) {
    // A file that cannot be read is bad input like one that does not fit the model (exit 2 for
    // both), and NaN weights would otherwise end the first step with a non-finite loss and a
    // hint at --lr. The loader reports an unreadable file as a run failure (tandem::Error), so
    // the file is read once here; make_classifier reads it again, from the page cache.
    models::NamedTensors weights;
    try {
      weights = models::load_safetensors(job.weights);
    } catch (const Error& e) {
      throw InvalidArgument("--weights " + job.weights +
                            " cannot be read: " + first_line(e.what()));
    }
    for (const auto& [name, t] : weights)
      if (t.is_floating_point() && !t.isfinite().all().item<bool>())
        throw InvalidArgument("--weights " + job.weights + ": tensor '" + name +
                              "' holds NaN or infinite values: expected finite weights");
  }
}

namespace {

// cuDNN's autotuning and TF32 as the flags say; --deterministic: deterministic kernels only.
void set_numerics(c10::Device dev, bool deterministic, bool tf32) {
  if (dev.is_cuda()) {
    at::globalContext().setBenchmarkCuDNN(!deterministic);
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  if (deterministic) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
}

// The message of a run a signal stopped; its exit code.
int report_stop(const train::TrainResult& r, int64_t spe, bool lead) {
  if (!lead) return 128 + r.stopped_by_signal;
  const char* name = r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM";
  std::fprintf(stderr,
               "tandem: stopped by %s after step %lld (epoch %lld); checkpoint %s. Resume with "
               "the same command and --resume.\n",
               name, static_cast<long long>(r.steps), static_cast<long long>(r.steps / spe + 1),
               r.last_checkpoint.c_str());
  return 128 + r.stopped_by_signal;
}

}  // namespace

bool TrainCommand::may_decode_on_engines() const {
  return decode == "auto" && !job.data.empty() && !train::is_idx_folder(job.data) &&
         !train::is_pairs_folder(job.data);
}

bool TrainCommand::settle_job(c10::Device dev) {
  job.device = dev;
  job.precision = parse_precision(precision);
  job.freeze_backbone = freeze == "backbone";
  const bool idx = train::is_idx_folder(job.data);
  const bool cnn = job.model == "small_cnn" || (job.model == "auto" && idx);
  const bool seg = train::is_pairs_folder(job.data);
  if (!given("--batch-size"))
    batch_size = cnn ? 128 : seg ? (dev.is_cuda() ? 32 : 4) : (dev.is_cuda() ? 256 : 16);
  if (seg && !dev.is_cuda() && !given("--image-size")) job.image_size = 128;  // CPU: finishes
  if (!given("--workers")) workers = run::default_loader_workers(dev);
  job.batch_size = batch_size;
  job.workers = workers;
  job.channels_last = given("--channels-last") ? channels_last : dev.is_cuda() && !cnn;
  job.seed = seed;
  job.crop_regions = crop == "region";
  if (given("--eval-cache-mb")) job.eval_cache_bytes = eval_cache_mb << 20;
  // A share that follows the rates makes the pixels depend on timing: a deterministic run
  // splits only at a share it is given.
  job.decode = deterministic && !given("--engine-share") ? "cpu" : decode;
  return seg;
}

optim::LrSchedule TrainCommand::lr_schedule(train::TrainJob& tj, int64_t spe, int64_t& warm) const {
  const int64_t total = epochs * spe;
  const double lr = tj.config["lr"].get<double>();
  warm = static_cast<int64_t>(std::llround(warmup_epochs * spe));
  // validate() saw --warmup-epochs < --epochs; in steps, rounding can still reach the end.
  TANDEM_CHECK_ARG(warm < total, "--warmup-epochs ", warmup_epochs, " is ", warm,
                   " steps: expected fewer than the run's ", total, " (", epochs, " epochs of ",
                   spe, " steps)");
  optim::LrSchedule after;
  if (schedule == "cosine")
    after = optim::cosine(lr, total - warm);
  else if (schedule == "step") {
    const int64_t every = given("--step-epochs") ? step_epochs : std::max<int64_t>(1, epochs / 3);
    after = optim::step_decay(lr, std::max<int64_t>(1, every * spe), gamma);
  } else
    after = optim::constant_lr(lr);
  tj.config["schedule"] = schedule;
  tj.config["warmup_epochs"] = warmup_epochs;
  if (schedule == "step") {
    tj.config["step_epochs"] = step_epochs;
    tj.config["gamma"] = gamma;
  }
  return warm > 0 ? optim::linear_warmup(warm, after) : after;
}

void TrainCommand::write_json(const std::string& command_line, const train::TrainJob& tj,
                              const train::TrainResult& r, const train::EpochsReport& report,
                              Mode m, c10::Device dev, int world, bool seg) const {
  const train::SteadyMean& train_rate = report.images_per_s;
  const double eval_ips = report.eval_images_per_s.value;
  nlohmann::json j;
  j["command"] = command_line;
  j["device"] = run::device_name(dev);
  j["job"] = tj.name;
  j["config"] = tj.config;
  j["mode"] = to_string(m);
  j["precision"] = precision;
  j["batch_size"] = batch_size;
  j["world_size"] = world;
  j["workers"] = workers;  // the loader's threads, and their nice value (0: the process's)
  j["worker_nice"] = job.worker_nice;
  j["cuda_wait"] = cuda_wait;
  j["images_per_s"] = train_rate.value;
  if (eval_ips > 0) j["eval_images_per_s"] = eval_ips;
  // The first epoch by the wall clock from its first step, and its evaluation: apart from the
  // steady means above, which leave them out.
  j["first_epoch_images_per_s"] = report.first_epoch_images_per_s;
  if (report.first_eval_images_per_s > 0)
    j["first_eval_images_per_s"] = report.first_eval_images_per_s;
  j["setup"] = train::to_json(r.setup);  // seconds besides the steps: the run's start, captures
  // and the evaluation's kernels run once during the first epoch
  if (tj.prepare_evaluation) j["setup"]["evaluation_prepare_s"] = r.evaluation_prepare_seconds;
  // cuDNN's tuning of the convolutions' kept plans, and what the plans file saved (null: none)
  j["setup"]["conv_plans"] = cli::conv_plans_json(models::conv_plans_summary());
  j["images_per_s_note"] = train_rate.first_left_out ? "mean over this run's epochs after the first"
                                                     : "mean over this run's epochs";
  // The headline metric: accuracy for a classifier, mIoU for a segmenter.
  const char* headline = seg ? "miou" : "accuracy";
  j["accuracy"] = r.epochs.empty() || !r.epochs.back().metrics.count(headline)
                      ? nlohmann::json(nullptr)
                      : nlohmann::json(r.epochs.back().metrics.at(headline));
  j["accuracy_metric"] = headline;
  j["epochs"] = static_cast<int64_t>(r.epochs.size());
  j["stopped_by_signal"] = r.stopped_by_signal;
  j["notes"] = r.notes;  // as printed: the modes' captures, a decode split's share
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : r.epochs) rows.push_back(train::to_json(e));  // metrics.jsonl's rows
  j["rows"] = rows;
  train::write_file_atomic(json, j.dump(2) + "\n");
  std::printf("wrote %s\n", json.c_str());
}

int TrainCommand::run(const std::string& command_line) {
  // Data parallel (torchrun, or the ranks --nproc started): this rank's device; rank 0 alone
  // prints and writes.
  const std::shared_ptr<distributed::ProcessGroup> group =
      run::join_data_parallel(device, timeouts.options());
  const bool lead = !group || group->rank() == 0;
  const int world = group ? group->world_size() : 1;
  if (!lead) quiet = true;
  // A worker torchrun's elastic agent restarted (--max-restarts) continues the run its folder
  // holds, as --resume does: the same run's checkpoints, or none yet; another run's is refused.
  const std::optional<distributed::LaunchEnv> launch = distributed::launch_env_from_environment();
  const bool restarted = group ? group->restarted() : launch && launch->restart > 0;
  if (!resume && restarted) {
    resume = true;
    if (lead)
      std::fprintf(stderr, "restarted by torchrun: continuing the run in %s, as --resume\n",
                   out.c_str());
  }
  const c10::Device dev = group ? group->device() : parse_device(device);
  const bool seg = settle_job(dev);
  // One of train_modes() or by-device: --mode's check.
  const run::RunMode parsed = mode == kByDevice ? std::nullopt : run::parse_run_mode(mode);
  const Mode m = run::resolve_mode_by_device(parsed, dev).mode;
  set_numerics(dev, deterministic, tf32);
  // Before the data and the model are built: every thread waits as asked from its first call.
  if (cuda_wait != "auto") set_cuda_wait(dev, parse_cuda_wait(cuda_wait));

  train::TrainJob tj = train::make_classifier(job);
  // The Trainer checks this too, but the schedule below needs the epoch's length first.
  const int64_t spe = tj.workload.data.batches_per_epoch(batch_size, world);
  TANDEM_CHECK_ARG(spe >= 1, "the training set (",
                   detail::count_of(tj.workload.data.dataset()->size(), "sample"),
                   ") makes no batch of ", batch_size, ": expected a smaller --batch-size");
  int64_t warm = 0;
  std::atomic<int> stop{0};
  train::TrainOptions to;
  to.schedule = lr_schedule(tj, spe, warm);
  to.epochs = epochs;
  to.batch_size = batch_size;
  to.mode = m;
  to.workers = workers;
  to.seed = seed;
  to.skip_bad = skip_bad;
  to.out_dir = out;
  to.resume = resume;
  to.checkpoint_every = checkpoint_every;
  to.keep_checkpoints = keep;
  to.stop = &stop;
  to.group = group;
  const bool tty = !quiet && ::isatty(STDERR_FILENO);
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  to.on_progress = [&](const train::TrainOptions::Progress& p) {
    if (!tty) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    std::fprintf(stderr, "\r\033[K%s", train::progress_line(p, batch_size, elapsed).c_str());
    std::fflush(stderr);
  };
  to.on_epoch = [&](const train::EpochRecord& r) {
    if (!lead) return;
    if (tty) std::fprintf(stderr, "\r\033[K");
    std::printf("%s\n", train::epoch_line(r, epochs).c_str());
    std::fflush(stdout);
  };

  // Every rank runs the lines below; only rank 0's stdout is kept (the others' goes nowhere).
  if (!lead && std::freopen("/dev/null", "w", stdout) == nullptr) {
    // freopen closed stdout before it failed: the rank's lines go nowhere all the same.
  }
  std::printf("train      %s\n", tj.name.c_str());
  if (group)
    std::printf("data parallel %d ranks over %s, batch %lld per rank\n", world,
                group->backend().c_str(), static_cast<long long>(batch_size));
  std::printf(
      "device     %s, mode %s, precision %s, batch %lld, %lld steps/epoch x %lld epochs, "
      "%d workers\n",
      dev.str().c_str(), to_string(m), precision.c_str(), static_cast<long long>(batch_size),
      static_cast<long long>(spe), static_cast<long long>(epochs), workers);
  std::printf("optimizer  %s lr %g (%s%s), weight decay %g\n", job.optimizer.c_str(),
              tj.config["lr"].get<double>(), schedule.c_str(), warm > 0 ? ", warm-up" : "",
              tj.config["weight_decay"].get<double>());
  std::printf("run folder %s%s\n", out.c_str(), resume ? " (resuming)" : "");
  if (lead && tj.workload.data.dataset() && !train::is_idx_folder(job.data) &&
      !train::is_pairs_folder(job.data)) {  // an ImageFolder: photos tandem shrink may shrink
    const data::KeptSize kept = data::kept_size(job.image_size);
    const std::string hint =
        data::shrink_hint(data::survey_photo_sizes(*tj.workload.data.dataset(), kept), kept,
                          job.image_size, job.data);
    if (!hint.empty()) std::printf("note       %s\n", hint.c_str());
  }
  std::fflush(stdout);

  train::Trainer trainer(tj, to);
  if (trainer.resumed()) std::printf("%s\n", train::resume_line(trainer.start_step(), spe).c_str());
  train::install_stop_handlers(&stop);
  const train::TrainResult r = trainer.run();
  if (group) group->finish();
  if (tty) std::fprintf(stderr, "\r\033[K");

  // The table of every epoch so far (a resumed run's earlier ones included).
  const train::EpochsReport report = train::describe_epochs(r, spe);
  std::printf("\n%s%s", report.text.c_str(),
              cli::conv_plans_line(models::conv_plans_summary()).c_str());
  if (!json.empty() && lead) write_json(command_line, tj, r, report, m, dev, world, seg);
  if (r.stopped_by_signal != 0) return report_stop(r, spe, lead);
  std::printf("weights    %s\n", r.weights.c_str());
  return 0;
}

}  // namespace tandem
