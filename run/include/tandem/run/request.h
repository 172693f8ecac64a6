// What a run of a workload asks for — the one place its fields are written down. Every front end
// (`tandem bench`, `tandem sweep`, tandem.Trainer's fit and benchmark(), a C++ program) fills a
// RunRequest; run_workload() (run_workload.h) turns it into the core's WorkloadOptions and
// RunOptions. What a front end does during a run — cancel it, set the learning rate before a
// step, make each instance data parallel — it hands in as RunHooks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/distributed/launch_env.h"
#include "tandem/mode.h"
#include "tandem/runner.h"
#include "tandem/workload.h"

namespace tandem::run {

/// A run's mode: one of the core's (mode.h), or auto — no value — which resolve_mode
/// (resolve_mode.h) turns into one by short timed trials. Auto is the run layer's: a Runner
/// only ever gets a mode.
using RunMode = std::optional<Mode>;

/// "auto" for no value, else the mode's name.
std::string mode_name(const RunMode& mode);
/// One line for help texts: what the mode does.
std::string describe_mode(const RunMode& mode);
/// Every mode a run can ask for: the workload modes, simplest first, then auto.
std::vector<RunMode> run_modes();
/// Parses a mode name or "auto"; throws InvalidArgument naming the bad value and every valid
/// one ("mode 'fast' is not valid: expected serial, pipelined, ... or auto").
RunMode parse_run_mode(const std::string& name);

struct RunRequest {
  /// What to run: a factory of fresh instances (one per run), its default batch sizes and
  /// parameters. The CLI takes it from the reference workloads by name.
  WorkloadEntry workload;
  /// Workload-specific settings, checked against workload.params by resolve().
  std::map<std::string, std::string> params;
  RunMode mode = Mode::kSerial;  ///< auto (no value): resolve_mode() (resolve_mode.h) first
  /// Modes this run cannot take, each with why (an optimizer a graph cannot capture, say):
  /// mode auto does not try them, and its trials list them with that reason as their error.
  std::map<Mode, std::string> ruled_out;
  /// Whether the step has stages a pipeline overlaps (a loader's host work, a feed): without
  /// them mode auto does not time the pipelined modes (resolve_mode.h: needs_no_trial).
  bool stages_to_overlap = true;
  std::string device = "auto";  ///< auto, cpu, cuda, cuda:N
  // Unset: resolve() fills the defaults: the workload's batch size for the device and
  // kGpuRunDefaults / kCpuRunDefaults for the rest.
  std::optional<int64_t> batch_size;
  std::optional<int64_t> steps;   ///< timed steps
  std::optional<int64_t> warmup;  ///< untimed steps before them
  std::optional<int> workers;     ///< loader worker threads (default_loader_workers)
  /// Let cuDNN time its algorithms on the first steps and keep the fastest (PyTorch's
  /// cudnn.benchmark). Default: on with CUDA. Tests that need bitwise repeatability turn it off.
  std::optional<bool> cudnn_benchmark;
  /// With cudnn_benchmark: how many of the algorithms cuDNN's heuristics rank highest it times
  /// for each convolution (PyTorch's cudnn.benchmark_limit; 0: every one it offers). Unset: the
  /// process's setting as it is (ATen's default is 10). More finds faster plans for some shapes
  /// and makes the first steps longer.
  std::optional<int> cudnn_benchmark_limit;
  /// Priority of the training lane: "high" (default) or "normal".
  std::string train_priority = "high";
  /// Priority of the feed stages' lanes (decode, augment; not the load's copy lane): "normal"
  /// (default) or "high".
  /// With train_priority "normal", their kernels (the JPEG decoder's among them) are scheduled
  /// ahead of the training's instead of behind a whole queued step.
  std::string input_priority = "normal";
  /// How the run's host threads wait for the GPU (cuda_wait.h): "auto" (default: CUDA's
  /// setting left as it is; CUDA spins on a host with more cores than contexts), "spin",
  /// "yield" or "block" (set for the run's device before anything is built).
  std::string cuda_wait = "auto";
  /// If not empty: write a Chrome-trace timeline of the timed steps to this file.
  std::string trace_path;
  /// If > 0: after the timed steps, this many more run under LibTorch's profiler and the report
  /// lists the GPU kernels they ran (RunReport::kernels). They are not timed.
  int64_t kernel_steps = 0;
  /// If not empty (needs kernel_steps > 0): write the profiler's Chrome trace of those steps to
  /// this file — every kernel, copy and CUDA API call on its stream or host thread.
  std::string kernel_trace_path;
  /// Draw a progress line on stderr when it is a terminal.
  bool progress = true;
  /// Read GPU utilization through NVML during the timed steps (a thread collecting the driver's
  /// own samples once a second); off leaves the run without any thread of tandem's besides its
  /// stages.
  bool gpu_monitor = true;
  /// Device time per stage from CUDA events on one timed step in every n, at a rotating
  /// position (every step with a trace): each event pair is a little work on the lane between
  /// the stage's kernels.
  int64_t device_timing_every = 4;
  uint64_t seed = 0;
  /// Files the workload reads (WorkloadOptions::data), for those that read any.
  std::string data;
  /// Leave samples that fail to load out of their batch and report them, instead of stopping
  /// (RunOptions::skip_bad).
  bool skip_bad = false;
  /// Data parallel, set by apply_data_parallel (data_parallel.h): this process's rank among
  /// world_size, which picks its data (WorkloadOptions/RunOptions::rank). Defaults: one process.
  int rank = 0, world_size = 1;
  /// The global step the run starts at, for a run that continues an earlier one: a dataset
  /// source starts there in its epoch order, resident batches at that index
  /// (RunOptions::first_step). Steps, losses and timing still count from the run's first.
  int64_t first_step = 0;
};

/// What a front end does during a run. Every hook may be empty.
struct RunHooks {
  /// Called on each fresh workload instance before its Runner is built: how a data-parallel
  /// front end makes it one rank of the job (distributed::make_data_parallel, data_parallel.h).
  std::function<void(Workload&)> prepare_workload;
  /// If set: read before every stage of every step; once true, the run stops there and
  /// run_workload throws RunError ("... cancelled"). How a front end that cannot signal the
  /// runner's threads (Python's Ctrl-C) stops a run cleanly.
  const std::atomic<bool>* cancel = nullptr;
  /// If set: called before each step's train stage with its global step (first_step, then
  /// first_step + 1, ..., warm-up included), on that stage's thread with its lane current —
  /// where a learning-rate schedule enqueues Optimizer::set_lr so that the step, eager or a
  /// graph replay, reads it (optim.h).
  std::function<void(int64_t step)> before_train_step;
};

/// Defaults: the reference workloads' sizes on a GPU; small ones on the CPU so a laptop finishes
/// in seconds. (The batch size is the workload's: WorkloadEntry::gpu_batch_size / cpu_batch_size.)
struct RunDefaults {
  int64_t steps, warmup;
};
constexpr RunDefaults kGpuRunDefaults{100, 10};
constexpr RunDefaults kCpuRunDefaults{4, 1};

/// Loader threads for a process training on `device` when the user gives no count: the one rule
/// of every front end (distributed/launch_env.h, where the launch's local ranks are known).
using distributed::default_loader_workers;

/// default_loader_workers in a --workers option's help, for every command that takes one.
inline constexpr const char* kLoaderWorkersHelp =
    "loader threads [default: cores - 1 on a GPU (at most 15), shared by this machine's ranks; "
    "2 on the CPU]";

/// Fills the defaults for the chosen device and validates everything (counts bounded: at most
/// kMaxLoaderWorkers loader threads, loader.h), before anything is built; throws InvalidArgument
/// naming the first bad value and what was expected.
RunRequest resolve(RunRequest request);

/// The core's options of a resolved request: what its workload instance is built with, and
/// what its Runner runs.
WorkloadOptions workload_options(const RunRequest& request);
RunOptions runner_options(const RunRequest& request);

/// Human-readable "key: value" lines of the resolved request.
std::string describe_request(const RunRequest& request);

}  // namespace tandem::run
