// `tandem train`: trains a classifier from a folder (IDX files or an ImageFolder) with the
// Trainer — progress on stderr, a summary table at the end, metrics and checkpoints in the run
// folder, a clean stop on Ctrl-C. Built where the data layer is.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "tandem/train/classifier.h"

namespace tandem {

struct TrainCommand {
  train::ClassifierOptions job;
  std::string precision = "fp32";
  std::string device = "auto";
  std::string mode = "auto";
  std::string freeze;          // "backbone" or empty
  std::string schedule = "cosine";
  double warmup_epochs = 0;
  int64_t step_epochs = 0;     // --schedule step: decay every N epochs [default: epochs / 3]
  double gamma = 0.1;
  int64_t epochs = 10;
  int64_t batch_size = 0;      // 0: by model and device
  int workers = 0;             // 0: by device
  uint64_t seed = 0;
  std::string out;
  bool resume = false;
  int64_t checkpoint_every = 0;
  int keep = 3;
  bool skip_bad = false;
  bool deterministic = false;
  bool tf32 = true;
  bool channels_last = false;
  CLI::Option* channels_last_opt = nullptr;  // not given: on for ResNets on a GPU
  CLI::Option* image_size_opt = nullptr;     // not given: 224, segmentation on the CPU 128
  std::string json;            // summary JSON file
  bool quiet = false;
  int nproc = 0;  ///< --nproc: data parallel over that many local ranks (main launches them)

  /// Adds the subcommand and its flags to `app`.
  CLI::App* add(CLI::App& app);
  /// Runs it; returns the process exit code (130 / 143 after SIGINT / SIGTERM).
  int run(const std::string& command_line);
};

}  // namespace tandem
