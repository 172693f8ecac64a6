// `tandem train`: trains a classifier from a folder (IDX files or an ImageFolder) with the
// Trainer — progress on stderr, a summary table at the end, metrics and checkpoints in the run
// folder, a clean stop on Ctrl-C. Built where the data layer is.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "data_parallel.h"  // TimeoutFlags
#include "tandem/mode.h"
#include "tandem/optim.h"
#include "tandem/train/classifier.h"
#include "tandem/train/report.h"
#include "tandem/train/trainer.h"

namespace tandem {

struct TrainCommand {
  train::ClassifierOptions job;
  std::string precision = "fp32";
  std::string device = "auto";
  std::string mode = "by-device";
  std::string freeze;  // "backbone" or empty
  std::string schedule = "cosine";
  std::string crop = "region";     // ImageFolder training: region or whole
  std::string decode = "auto";     // ImageFolder training: cpu or auto (with the JPEG engines)
  std::string cuda_wait = "auto";  // how the run's threads wait for the GPU (cuda_wait.h)
  // The flags below that a comment says "not given: ..." are read only when given(): their
  // defaults depend on the model, the data or the device, and a given 0 is refused.
  double warmup_epochs = 0;
  int64_t step_epochs = 0;  // --schedule step; not given: epochs / 3
  double gamma = 0.1;
  int64_t epochs = 10;
  int64_t batch_size = 0;     // not given: by model and device
  int workers = 0;            // not given: by device
  int64_t eval_cache_mb = 0;  // not given: ClassifierOptions' default
  uint64_t seed = 0;
  std::string out;
  bool resume = false;
  int64_t checkpoint_every = 0;
  int keep = 3;
  bool skip_bad = false;
  bool deterministic = false;
  bool tf32 = true;
  bool channels_last = false;  // not given: on for ResNets on a GPU
  std::string json;            // summary JSON file
  bool quiet = false;
  int nproc = 0;  ///< --nproc: data parallel over that many local ranks (main launches them)
  TimeoutFlags timeouts;  ///< --join-timeout, --heartbeat-timeout: the data-parallel job's

  /// Adds the subcommand and its flags to `app`.
  CLI::App* add(CLI::App& app);
  /// Checks every flag once parsed, before anything runs (main calls it before --nproc starts
  /// ranks, and each rank before run() joins them): ranges and finiteness, --device, the output
  /// paths, the --weights file. Throws InvalidArgument naming the flag, its value and what was
  /// expected. (Names — --model, --mode, --optimizer, ... — CLI11 checks while parsing.)
  void validate() const;
  /// Whether the run may decode JPEGs on the engines: an ImageFolder (not Fashion-MNIST's idx
  /// files, not image/mask pairs) with --decode auto.
  bool may_decode_on_engines() const;
  /// Whether the run may train a ResNet, whose convolutions take kept plans (every model but
  /// small_cnn; auto's pick for IDX files included, which reads the plans file for nothing).
  bool uses_conv_plans() const { return job.model != "small_cnn"; }
  /// Runs it; returns the process exit code (130 / 143 after SIGINT / SIGTERM).
  int run(const std::string& command_line);

 private:
  /// Whether `flag` was on the command line (a default was not used).
  bool given(const char* flag) const;
  /// The job's settings for device `dev`: the flags given, the others' defaults for the data
  /// (its kind) and the device. Returns whether the data is image + mask pairs (a segmenter).
  bool settle_job(c10::Device dev);
  /// The learning rate per step of a run of `steps_per_epoch` steps an epoch (--schedule, with
  /// --warmup-epochs' linear warm-up before it), written into the job's config; `warm_steps`:
  /// the warm-up's steps.
  optim::LrSchedule lr_schedule(train::TrainJob& tj, int64_t steps_per_epoch,
                                int64_t& warm_steps) const;
  /// --json's report of a finished or stopped run.
  void write_json(const std::string& command_line, const train::TrainJob& tj,
                  const train::TrainResult& r, const train::EpochsReport& report, Mode m,
                  c10::Device dev, int world, bool seg) const;

  CLI::App* app_ = nullptr;  // the subcommand: its options say which flags were given
};

}  // namespace tandem
