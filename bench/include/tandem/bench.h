// The benchmark front end of the runner (`tandem bench`): the reference workloads' timing method
// (warm-up steps, then timed steps between two device synchronizations) applied to any workload and
// mode — the reference ones (workloads/registry.h) or a user's, handed in as a WorkloadEntry.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/kernel_profile.h"
#include "tandem/mode.h"
#include "tandem/pipeline.h"
#include "tandem/workload.h"

namespace tandem {

struct BenchOptions {
  /// What to run: a factory of fresh instances (one per run), its default batch sizes and
  /// parameters. The CLI takes it from the reference workloads by name.
  WorkloadEntry workload;
  /// Workload-specific settings, checked against workload.params by resolve().
  std::map<std::string, std::string> params;
  Mode mode = Mode::kSerial;  ///< kAuto: run_auto()
  std::string device = "auto";  ///< auto, cpu, cuda, cuda:N
  // Unset: resolve() fills the defaults: the workload's batch size for the device and
  // kGpuBenchDefaults / kCpuBenchDefaults for the rest.
  std::optional<int64_t> batch_size;
  std::optional<int64_t> steps;   ///< timed steps
  std::optional<int64_t> warmup;  ///< untimed steps before them
  std::optional<int> workers;     ///< loader worker threads
  /// Let cuDNN time its algorithms on the first steps and keep the fastest (PyTorch's
  /// cudnn.benchmark). Default: on with CUDA. Tests that need bitwise repeatability turn it off.
  std::optional<bool> cudnn_benchmark;
  /// Priority of the training lane: "high" (default) or "normal".
  std::string train_priority = "high";
  /// If not empty: write a Chrome-trace timeline of the timed steps to this file.
  std::string trace_path;
  /// If > 0: after the timed steps, this many more run under LibTorch's profiler and the result
  /// lists the GPU kernels they ran (BenchResult::kernels). They are not timed.
  int64_t kernel_steps = 0;
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
  /// Data parallel, set by a front end that joined a job (tools/tandem/data_parallel.h): this
  /// process's rank among world_size, which picks its data (WorkloadOptions/RunOptions::rank),
  /// and what makes each fresh workload instance data parallel before it runs
  /// (dist::make_data_parallel). Defaults: one process.
  int rank = 0, world_size = 1;
  std::function<void(Workload&)> prepare_workload;
  /// If set: read before every stage of every step; once true, the run stops there and
  /// run_bench throws RunError ("... cancelled"). How a front end that cannot signal the
  /// runner's threads (Python's Ctrl-C) stops a run cleanly.
  const std::atomic<bool>* cancel = nullptr;
  /// The global step the run starts at, for a run that continues an earlier one: a dataset
  /// source starts there in its epoch order, resident batches at that index
  /// (RunOptions::first_step). Steps, losses and timing still count from the run's first.
  int64_t first_step = 0;
  /// If set: called before each step's train stage with its global step (first_step, then
  /// first_step + 1, ..., warm-up included), on that stage's thread with its lane current —
  /// where a learning-rate schedule enqueues Optimizer::set_lr so that the step, eager or a
  /// graph replay, reads it (optim.h).
  std::function<void(int64_t step)> before_train_step;
};

/// Defaults: the reference workloads' sizes on a GPU; small ones on the CPU so a laptop finishes in seconds.
/// (The batch size is the workload's: WorkloadEntry::gpu_batch_size / cpu_batch_size.)
struct BenchDefaults {
  int64_t steps, warmup;
  int workers;
};
constexpr BenchDefaults kGpuBenchDefaults{100, 10, 8};
constexpr BenchDefaults kCpuBenchDefaults{4, 1, 2};

/// "cpu", or the GPU's name ("NVIDIA H200").
std::string device_name(c10::Device device);

/// Fills the defaults for the chosen device and validates everything (counts bounded: at most
/// kMaxLoaderWorkers loader threads, loader.h), before anything is built; throws InvalidArgument naming the
/// first bad value and what was expected.
BenchOptions resolve(BenchOptions options);

struct BenchResult {
  BenchOptions options;         ///< resolved
  std::string device_name;      ///< e.g. "NVIDIA H200" or "cpu"
  std::string torch_version;
  double seconds = 0;           ///< wall time of the timed steps
  double steps_per_s = 0;
  double samples_per_s = 0;
  std::vector<float> losses;    ///< every step, warm-up included
  Pipeline::Timing timing;      ///< per stage, over the timed steps
  /// NVML's mean GPU utilization over the timed steps, or nullopt (see gpu_utilization_note).
  std::optional<double> gpu_utilization;
  std::string gpu_utilization_note;
  /// The slowest stage of this run, ms per step: device time on a GPU, host time on the CPU.
  /// Its rate, 1000 / floor_ms, is what perfect overlap of the stages would reach.
  double floor_ms = 0;
  std::string floor_stage;
  /// steps_per_s / (1000 / floor_ms).
  double efficiency = 0;
  std::vector<std::string> notes;  ///< the runner's (Runner::notes)
  std::vector<SkippedSample> skipped;  ///< samples left out (skip_bad), each with why
  std::optional<KernelProfile> kernels;  ///< with kernel_steps
};

/// Runs options.warmup + options.steps training steps and times the last options.steps.
/// `options` must be resolved.
BenchResult run_bench(const BenchOptions& options);

/// Human-readable "key: value" lines of the resolved configuration.
std::string describe_config(const BenchOptions& options);
/// A fixed-width table of the result.
std::string describe_result(const BenchResult& result);
nlohmann::json to_json(const BenchResult& result);

}  // namespace tandem
