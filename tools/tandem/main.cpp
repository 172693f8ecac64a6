// The tandem CLI: parse flags, call the library, print. Exit codes: 0 success, 1 the run failed,
// 2 bad command-line input (one line on stderr naming the value and what was expected).
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "augment_bench.h"
#include "cli_util.h"
#include "conv_plans_report.h"
#include "data_parallel.h"
#include "tandem/detail/lane.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/error.h"
#include "tandem/hardware_queues.h"
#include "tandem/mode.h"
#include "tandem/models/tuned_conv.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/run/run_workload.h"
#include "tandem/run/sweep.h"
#include "tandem/workloads/registry.h"
#ifdef TANDEM_HAVE_IMAGES
#include "data_bench.h"
#include "shrink_command.h"
#endif
#ifdef TANDEM_HAVE_TRAIN
#include "train_command.h"
#endif

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// sweep --modes' word for every workload mode (SweepOptions::modes).
constexpr const char* kAllModes = "all";

/// Opens `path` for writing now, so a bad path fails before a long run, not after it. `option`
/// names the flag that gave it.
std::ofstream open_output(const std::string& path, const std::string& option) {
  std::ofstream out;
  if (path.empty()) return out;
  tandem::cli::check_output_file(option, path);  // the reasons open() would not give
  out.open(path);
  if (!out)
    throw tandem::InvalidArgument(option + " path '" + path +
                                  "' cannot be written: " + std::strerror(errno));
  return out;
}

/// Keeps LibTorch's own log lines below errors off stderr: c10d's store warnings when a rank
/// loses rank 0 carry a 30-line C++ backtrace ahead of the CLI's one line, which already names
/// the cause. TANDEM_DEBUG=1, or LibTorch's TORCH_CPP_LOG_LEVEL, keeps them.
void quiet_libtorch_warnings() {
  if (std::getenv("TANDEM_DEBUG") || std::getenv("TORCH_CPP_LOG_LEVEL")) return;
  FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, static_cast<int>(c10::GLOG_ERROR));
}

/// Writes and closes; a write the disk refused (full, gone) is an error, never silent.
void write_output(std::ofstream& out, const std::string& text, const std::string& path) {
  if (!out.is_open()) return;
  errno = 0;
  out << text;
  out.close();
  if (out.fail())
    throw tandem::Error("writing '" + path + "' failed" +
                        (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  std::cout << "wrote " << path << "\n";
}

/// "seg 8, cls 32, mlp 640 on a GPU; 2, 2, 16 on the CPU": for help texts.
std::string default_batch_sizes() {
  std::string gpu, cpu;
  for (const auto& e : tandem::reference_workloads()) {
    gpu += (gpu.empty() ? "" : ", ") + e.name + " " + std::to_string(e.gpu_batch_size);
    cpu += (cpu.empty() ? "" : ", ") + std::to_string(e.cpu_batch_size);
  }
  return gpu + " on a GPU; " + cpu + " on the CPU";
}

/// The reference workloads and their parameters, for help texts.
std::string workload_help() {
  std::string out;
  for (const auto& e : tandem::reference_workloads()) {
    out += "\n  " + e.name + ": " + e.description;
    for (const auto& p : e.params)
      out +=
          "\n    --param " + p.key + "=" + tandem::join_choices(p.choices) + ": " + p.description;
  }
  return out;
}

/// The flags `bench` and `sweep` share; values land in `options` once parsed (see apply()).
struct RunFlags {
  int64_t batch_size = 0, steps = 0, warmup = 0;
  int workers = 0;
  bool cudnn_benchmark = false;
  int cudnn_benchmark_limit = 0;
  std::string workload = "seg";
  std::vector<std::string> params;
  std::string decode;  // --decode: workload images' decode parameter

  /// The workload's parameters as the run gets them: --param's KEY=VALUE pairs (a later one
  /// over an earlier), then --decode over them. Throws InvalidArgument for a pair without '='.
  std::map<std::string, std::string> merged_params() const {
    std::map<std::string, std::string> out;
    for (const auto& kv : params) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw tandem::InvalidArgument("parameter '" + kv + "' is not valid: expected KEY=VALUE");
      out[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    if (!decode.empty()) out["decode"] = decode;  // checked by the workload's params
    return out;
  }

  /// Whether a run with these flags may decode JPEGs on the engines: files from --data with
  /// decode gpu or auto (workload images decodes on the workers alone by default).
  bool may_decode_on_engines(const tandem::run::RunRequest& options) const {
    if (options.data.empty()) return false;
    const auto merged = merged_params();
    const auto it = merged.find("decode");
    return it != merged.end() && (it->second == "gpu" || it->second == "auto");
  }
  // Whether the run's convolutions take kept plans (workload images' convs=plans, its
  // default): only then is the plans file read, which Python's runtime-compiled plans can make
  // megabytes long.
  bool uses_conv_plans() const {
    if (workload != "images") return false;
    const auto merged = merged_params();
    const auto it = merged.find("convs");
    return it == merged.end() || it->second == "plans";
  }
  CLI::Option *steps_opt, *warmup_opt, *workers_opt, *cudnn_opt, *cudnn_limit_opt,
      *batch_size_opt = nullptr;

  void add(CLI::App* app, tandem::run::RunRequest& options) {
    app->add_option("--workload,--scenario", workload,
                    "workload: " + tandem::join_choices(tandem::reference_workload_names()) +
                        workload_help())
        ->capture_default_str();
    app->add_option("--param", params,
                    "a workload-specific setting KEY=VALUE (repeatable; see --workload)");
    steps_opt =
        app->add_option("--steps", steps, "timed steps [default: 100 on a GPU, 4 on the CPU]");
    warmup_opt = app->add_option("--warmup", warmup,
                                 "untimed warm-up steps [default: 10 on a GPU, 1 on the CPU]");
    workers_opt = app->add_option("--workers", workers, tandem::run::kLoaderWorkersHelp);
    app->add_option("--seed", options.seed, "seed for models and data")->capture_default_str();
    app->add_option("--data", options.data,
                    "a folder the workload reads (workload images: an ImageFolder, one "
                    "subfolder of JPEG/PNG files per class)");
    app->add_option("--decode", decode,
                    "where workload images decodes JPEGs: cpu (the loader's workers), gpu "
                    "(nvJPEG on the augment lane) or auto (with crop regions and JPEG engines, "
                    "each batch split between the workers and the engines by their measured "
                    "rates; else a short trial picks one); the same as --param decode=...");
    app->add_flag("--skip-bad", options.skip_bad,
                  "leave samples that fail to load (corrupt, truncated, unreadable files) out of "
                  "their batch, count them and report them at the end and in the JSON, instead "
                  "of stopping the run");
    app->add_option("--device", options.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    cudnn_opt = app->add_flag("--cudnn-benchmark,!--no-cudnn-benchmark", cudnn_benchmark,
                              "let cuDNN autotune convolution algorithms [default: on with CUDA]");
    cudnn_limit_opt =
        app->add_option("--cudnn-benchmark-limit", cudnn_benchmark_limit,
                        "how many of cuDNN's highest-ranked algorithms the autotuning times for "
                        "each convolution: 0 for every one (faster plans for some shapes, longer "
                        "first steps) [default: PyTorch's, 10]");
    app->add_option("--train-priority", options.train_priority,
                    "stream priority of the training lane: high or normal")
        ->capture_default_str();
    app->add_option("--input-priority", options.input_priority,
                    "stream priority of the feed stages' lanes (decode, augment; the load's copy "
                    "lane stays normal): high or normal; high with --train-priority normal puts "
                    "their kernels ahead of the training's")
        ->capture_default_str();
    app->add_option("--cuda-wait", options.cuda_wait,
                    "how the run's threads wait for the GPU: auto (CUDA's choice: they spin, "
                    "holding a core), spin, yield, or block (they sleep until the work is done, "
                    "leaving the cores to the loader's workers)")
        ->capture_default_str();
    app->add_flag("--gpu-monitor,!--no-gpu-monitor", options.gpu_monitor,
                  "sample GPU utilization through NVML during the timed steps [default: on]");
    app->add_option("--device-timing-every", options.device_timing_every,
                    "time each stage on the device (a CUDA event pair) on one timed step in every "
                    "N (the position rotates); 1: every step (always so with --trace)")
        ->capture_default_str();
  }
  // Flags not given stay unset, so the library picks the device's defaults.
  void apply(tandem::run::RunRequest& options) const {
    options.workload = tandem::find_reference_workload(workload);
    for (auto& [key, value] : merged_params()) options.params[key] = std::move(value);
    if (batch_size_opt && batch_size_opt->count()) options.batch_size = batch_size;
    if (steps_opt->count()) options.steps = steps;
    if (warmup_opt->count()) options.warmup = warmup;
    if (workers_opt->count()) options.workers = workers;
    if (cudnn_opt->count()) options.cudnn_benchmark = cudnn_benchmark;
    if (cudnn_limit_opt->count()) options.cudnn_benchmark_limit = cudnn_benchmark_limit;
  }
};

/// When LibTorch failed to allocate, the allocator's words ("DefaultCPUAllocator: can't
/// allocate memory: you tried to allocate 4000000000008 bytes. ..."); else empty. CUDA's caching
/// allocator throws OutOfMemoryError; the CPU allocator a plain c10::Error (CAFFE_ENFORCE's,
/// "[enforce fail at alloc_cpu.cpp:127] err == 0. " first), known by its name.
std::string out_of_memory_cause(const c10::Error& e) {
  const std::string what = tandem::first_line(e.what_without_backtrace());
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return what;
  const size_t cpu = what.find("DefaultCPUAllocator");
  return cpu == std::string::npos ? std::string() : what.substr(cpu);
}

/// run_bench_command's run, once the options are resolved.
int run_bench_resolved(const tandem::run::RunRequest& options, const tandem::run::RunHooks& hooks,
                       const std::shared_ptr<tandem::distributed::ProcessGroup>& group,
                       const std::string& json_path) {
  const bool lead = !group || group->rank() == 0;
  std::ofstream json = open_output(lead ? json_path : std::string(), "--json");
  std::ofstream trace_probe = open_output(options.trace_path, "--trace");
  trace_probe.close();
  std::ofstream kernel_trace_probe = open_output(options.kernel_trace_path, "--kernel-trace");
  kernel_trace_probe.close();
  if (lead) std::cout << tandem::run::describe_request(options) << std::flush;
  if (group && lead)
    std::cout << "data parallel  " << group->world_size() << " ranks over " << group->backend()
              << ", batch size " << *options.batch_size << " per rank\n"
              << std::flush;
  nlohmann::json out;
  tandem::run::RunReport result;
  if (!options.mode) {  // auto
    if (lead)
      std::cout << "\nauto: trials of " << tandem::run::kAutoTrialWarmup << " warm-up + "
                << tandem::run::kAutoTrialSteps << " timed steps per mode (up to "
                << tandem::run::kAutoTrialMaxSteps << " where that took under "
                << tandem::run::kAutoTrialSeconds << " s), " << tandem::run::kAutoTrialRuns
                << " runs each, ranked by the slower"
                << (group ? "; every rank alone, then rank 0's pick" : "") << "\n"
                << std::flush;
    tandem::run::AutoReport a = group ? tandem::run::run_auto_as_rank(options, hooks, *group)
                                      : tandem::run::run_auto(options, hooks);
    const tandem::run::ModeResolution& resolution = a.resolution;
    for (const auto& t : resolution.trials) {
      if (!lead) break;  // rank 0 alone prints
      if (t.steps_per_s) {
        std::string runs;
        for (double r : t.runs) {
          char run[32];
          std::snprintf(run, sizeof run, "%s%.2f", runs.empty() ? "" : ", ", r);
          runs += run;
        }
        std::printf("  trial %-17s %10.2f steps/s   (runs: %s)\n", t.mode.c_str(), *t.steps_per_s,
                    runs.c_str());
      } else
        std::printf("  trial %-17s failed: %s\n", t.mode.c_str(), t.error.c_str());
    }
    if (lead)
      std::printf("auto: picked %s (%s); trials took %.1f s\n", resolution.decision.mode.c_str(),
                  resolution.decision.reason.c_str(), resolution.trial_seconds);
    std::fflush(stdout);
    result = a.report;
    out = tandem::run::to_json(result);
    out["mode"] = "auto";
    out.update(tandem::run::to_json(resolution));
  } else {
    result = tandem::run::run_workload(options, hooks);
    out = tandem::run::to_json(result);
  }
  if (group) {
    const nlohmann::json block = tandem::run::reduce_over_ranks(result, *group);
    group->finish();
    if (!lead) return 0;
    out.update(tandem::run::to_json(result));  // the ranks' mean losses; auto's keys stay
    out["data_parallel"] = block;
    std::printf("\n%s\n", tandem::run::describe_data_parallel(block).c_str());
  }
  // What cuDNN's tuning cost this run, and what the plans file saved it (null: no kept plans).
  const tandem::models::ConvPlansSummary plans = tandem::models::conv_plans_summary();
  out["conv_plans"] = tandem::cli::conv_plans_json(plans);
  std::cout << "\n"
            << tandem::run::describe_report(result) << tandem::cli::conv_plans_line(plans)
            << std::flush;
  write_output(json, out.dump(2) + "\n", json_path);
  if (!options.trace_path.empty()) std::cout << "wrote " << options.trace_path << "\n";
  if (!options.kernel_trace_path.empty())
    std::cout << "wrote " << options.kernel_trace_path << "\n";
  return 0;
}

int run_bench_command(tandem::run::RunRequest options, const std::string& json_path,
                      const tandem::distributed::DataParallelOptions& data_parallel,
                      const tandem::distributed::ProcessGroupOptions& group_options) {
  // Data parallel (torchrun, or the ranks --nproc started): join, then run as this rank; rank 0
  // alone prints and writes.
  const std::shared_ptr<tandem::distributed::ProcessGroup> group =
      tandem::run::join_data_parallel(options.device, group_options);
  tandem::run::RunHooks hooks;
  tandem::run::apply_data_parallel(options, hooks, group, data_parallel);
  if (group && group->rank() != 0) {
    options.trace_path.clear();
    options.kernel_trace_path.clear();
  }
  options = tandem::run::resolve(options);
  try {
    return run_bench_resolved(options, hooks, group, json_path);
  } catch (const c10::Error& e) {
    // The allocator's own line names bytes, not the flags that asked for them (the batch's
    // tensors, the loss log of every step). Exit 2, as for a loader ring that cannot fit (the
    // footer says so): the sizes are the user's to lower.
    const std::string cause = out_of_memory_cause(e);
    if (cause.empty()) throw;
    throw tandem::InvalidArgument(tandem::detail::concat(
        "--batch-size ", *options.batch_size, " with --steps ", *options.steps, " and --warmup ",
        *options.warmup, " does not fit in ", options.device, " memory (", cause,
        "): expected a smaller --batch-size or --steps"));
  }
}

int run_sweep_command(tandem::run::SweepOptions options, const std::string& csv_path,
                      const std::string& json_path, const std::string& svg_path) {
  // The rows' modes ("all" among them) are checked by run_sweep; any valid mode resolves the rest.
  options.base.mode = std::nullopt;                   // auto
  options.base = tandem::run::resolve(options.base);  // validates device, workload, counts
  options.base.batch_size.reset();
  std::ofstream csv = open_output(csv_path, "--csv");
  std::ofstream json = open_output(json_path, "--json");
  std::ofstream svg = open_output(svg_path, "--svg");
  std::cout << "sweep " << options.base.workload.name << " on " << options.base.device << ": "
            << *options.base.steps << " timed steps after " << *options.base.warmup
            << " warm-up per point"
            << (options.rounds > 1 ? ", " + std::to_string(options.rounds) + " rounds (medians)"
                                   : std::string())
            << "\n"
            << std::flush;
  const auto rows = tandem::run::run_sweep(options, [](const tandem::run::SweepRow& r) {
    std::cerr << "  done: " << r.mode << " at batch " << r.batch_size
              << (r.error.empty() ? "" : " (failed)") << "\n";
  });
  std::cout << "\n" << tandem::run::sweep_table(rows) << std::flush;
  write_output(csv, tandem::run::sweep_csv(rows), csv_path);
  write_output(json, tandem::run::sweep_json(rows, options).dump(2) + "\n", json_path);
  write_output(svg,
               tandem::run::sweep_svg(rows, "tandem " + options.base.workload.name + " on " +
                                                options.base.device + ": steps/s by batch size"),
               svg_path);
  tandem::run::check_some_point_ran(rows);  // after the files: they say why each point failed
  return 0;
}

int run_augment_bench_command(const std::vector<int64_t>& batch_sizes, const std::string& device,
                              int repeats, const std::vector<std::string>& sampling_names,
                              const std::string& json_path) {
  std::vector<tandem::AugmentSampling> samplings;
  for (const auto& name : sampling_names) samplings.push_back(tandem::parse_augment_sampling(name));
  const c10::Device dev = tandem::parse_device(device);
  std::ofstream json = open_output(json_path, "--json");
  std::cout << "augment-bench on " << dev << ": the cls workload's augmentation, "
            << "(B, 3, 256, 256) uint8 -> float32, median of " << repeats << " timings\n"
            << std::flush;
  const auto rows = tandem::run_augment_bench(batch_sizes, dev, repeats, {}, samplings);
  std::cout << "\n" << tandem::describe_augment_bench(rows) << std::flush;
  write_output(json, tandem::augment_bench_json(rows).dump(2) + "\n", json_path);
  return 0;
}

#ifdef TANDEM_HAVE_IMAGES
int run_data_bench_command(tandem::DataBenchOptions options, const std::string& json_path,
                           const std::string& command) {
  std::ofstream json = open_output(json_path, "--json");
  const tandem::DataBenchResult r = tandem::run_data_bench(options);
  std::cout << "\n" << tandem::describe_data_bench(r) << std::flush;
  write_output(json, tandem::data_bench_json(r, command).dump(2) + "\n", json_path);
  return 0;
}
#endif

// Each subcommand: its options, added at start-up, and what it runs once parsed.

struct BenchCommand {
  tandem::run::RunRequest options;
  std::string json, mode = "serial";
  RunFlags flags;
  int nproc = 0;
  double bucket_cap_mb = 25.0;
  bool gathered_grad = true;
  tandem::TimeoutFlags timeouts;  // the data-parallel job's
  CLI::App* app = nullptr;

  bool may_decode_on_engines() const { return flags.may_decode_on_engines(options); }
  bool uses_conv_plans() const { return flags.uses_conv_plans(); }

  void add(CLI::App& parent) {
    app = parent.add_subcommand("bench",
                                "Train a workload in one mode and report steps/s (the reference "
                                "method: warm-up steps, then timed steps between device "
                                "synchronizations).");
    flags.add(app, options);
    app->add_option("--mode", mode,
                    "how to run the step:" + tandem::cli::mode_help(tandem::cli::modes_with_auto()))
        ->check(tandem::cli::mode_validator(tandem::cli::modes_with_auto()))
        ->capture_default_str();
    flags.batch_size_opt = app->add_option(
        "--batch-size", flags.batch_size,
        "samples per step [default: the workload's: " + default_batch_sizes() + "]");
    app->add_option("--trace", options.trace_path,
                    "write a Chrome-trace timeline of the timed steps to this file "
                    "(open in ui.perfetto.dev or chrome://tracing)");
    app->add_option("--kernels", options.kernel_steps,
                    "after the timed steps, run N more under LibTorch's profiler and list the "
                    "GPU kernels they ran, with device time per step, and the CUDA API calls "
                    "that held each host thread longest (table and --json)");
    app->add_option("--kernel-trace", options.kernel_trace_path,
                    "with --kernels N: also write those steps' profiler trace to this file "
                    "(every kernel, copy and CUDA API call on its stream or thread; open in "
                    "ui.perfetto.dev)");
    app->add_option("--json", json, "also write the result as JSON to this file");
    app->add_option("--nproc", nproc,
                    "data parallel on this machine: start N ranks (one per GPU, or N CPU "
                    "processes with --device cpu) under torchrun's environment contract; "
                    "--batch-size is per rank. torchrun --nproc-per-node N --no-python tandem "
                    "bench ... does the same");
    app->add_option("--bucket-cap-mb", bucket_cap_mb,
                    "data parallel: gradients go over the wire in buckets of at most this many "
                    "MB (the first bucket 1 MB), as PyTorch DDP's bucket_cap_mb")
        ->check(CLI::Validator(
            [](std::string& value) {
              char* end = nullptr;
              const double mb = std::strtod(value.c_str(), &end);
              return end != value.c_str() && *end == '\0' && mb > 0
                         ? std::string()
                         : value + " is not valid: expected a size in MB > 0";
            },
            "MB > 0"))
        ->capture_default_str();
    app->add_flag("--gathered-grad,!--no-gathered-grad", gathered_grad,
                  "data parallel: the model's GatheredGrad layers form their weight gradients "
                  "from every rank's gathered batch instead of all-reducing them [default: on]");
    timeouts.add(app);
  }

  int run(int argc, char** argv) {
    if (auto code = tandem::launch_if_asked(nproc, argc, argv)) return *code;
    flags.apply(options);
    options.mode = tandem::run::parse_run_mode(mode);
    tandem::distributed::DataParallelOptions data_parallel;
    data_parallel.bucket_cap_mb = bucket_cap_mb;
    data_parallel.gathered_grad = gathered_grad;
    return run_bench_command(options, json, data_parallel, timeouts.options());
  }
};

struct SweepCommand {
  tandem::run::SweepOptions options;
  std::string csv, json, svg;
  RunFlags flags;
  CLI::App* app = nullptr;

  bool may_decode_on_engines() const { return flags.may_decode_on_engines(options.base); }
  bool uses_conv_plans() const { return flags.uses_conv_plans(); }

  void add(CLI::App& parent) {
    app = parent.add_subcommand("sweep",
                                "Run every mode at every batch size; print a table, write CSV, "
                                "JSON and an SVG chart.");
    flags.add(app, options.base);
    char all_line[128];  // "all" in mode_help's layout
    std::snprintf(all_line, sizeof all_line, "\n  %-18s %s", kAllModes,
                  "every mode but auto, the baseline first");
    app->add_option("--modes", options.modes,
                    "comma-separated modes [default: all]:" + std::string(all_line) +
                        tandem::cli::mode_help(tandem::cli::modes_with_auto()))
        ->check(tandem::cli::mode_validator(tandem::cli::modes_with_auto(), {kAllModes}))
        ->delimiter(',');
    app->add_option("--batch-sizes", options.batch_sizes, "comma-separated batch sizes")
        ->delimiter(',')
        ->required();
    app->add_option("--rounds", options.rounds,
                    "runs of every point, each on a fresh instance, the modes taking turns; a "
                    "point reports the median")
        ->capture_default_str();
    app->add_option("--csv", csv, "write the rows as CSV to this file");
    app->add_option("--json", json, "write the rows as JSON to this file");
    app->add_option("--svg", svg, "write a chart of steps/s by batch size to this file");
  }

  int run() {
    flags.apply(options.base);
    return run_sweep_command(options, csv, json, svg);
  }
};

struct AugmentBenchCommand {
  std::vector<int64_t> batch_sizes{32, 128};
  std::string device = "auto", json;
  int repeats = 50;
  std::vector<std::string> samplings{"auto"};
  CLI::App* app = nullptr;

  void add(CLI::App& parent) {
    app = parent.add_subcommand("augment-bench",
                                "Time the fused augmentation kernel alone (and a device copy of "
                                "as many bytes, its ceiling).");
    app->add_option("--batch-sizes", batch_sizes, "comma-separated batch sizes")
        ->delimiter(',')
        ->capture_default_str();
    app->add_option("--device", device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    app->add_option("--repeats", repeats, "timings per batch size (median reported)")
        ->capture_default_str();
    app->add_option("--sampling", samplings,
                    "how the kernel reads the source, comma-separated for one row each: auto "
                    "(texture gathers where possible), gather, staged (the source window in "
                    "shared memory)")
        ->delimiter(',')
        ->capture_default_str();
    app->add_option("--json", json, "write the rows as JSON to this file");
  }

  int run() { return run_augment_bench_command(batch_sizes, device, repeats, samplings, json); }
};

#ifdef TANDEM_HAVE_IMAGES
struct DataBenchCommand {
  tandem::DataBenchOptions options;
  std::string json, mode = "pipelined";
  CLI::App* app = nullptr;

  void add(CLI::App& parent) {
    tandem::DataBenchOptions& db = options;
    app = parent.add_subcommand(
        "data-bench",
        "How fast tandem reads a folder of images: decode on one core (DCT-scaled and full "
        "size), the loader with its workers, and workload images fed from the folder beside the "
        "same step on device-resident data, with the stage report.");
    app->add_option("--data", db.data, "an ImageFolder: one subfolder of JPEG/PNG per class")
        ->required();
    app->add_option("--decode", db.decode,
                    "cpu (TurboJPEG in the loader's workers), gpu (nvJPEG on the augment "
                    "lane) or auto (workload images' decode=auto): the end-to-end run's "
                    "decode, and which decode rows are timed (auto: both)")
        ->capture_default_str();
    app->add_option("--images", db.decode_images, "files timed by the decode rows")
        ->capture_default_str();
    app->add_option("--loader-images", db.loader_images,
                    "images the loader row drains (whole batches)")
        ->capture_default_str();
    app->add_option("--workers", db.run.workers, tandem::run::kLoaderWorkersHelp);
    // Bound to the optionals themselves, so a given 0 or -1 reaches check_data_bench_options.
    app->add_option("--batch-size", db.run.batch_size,
                    "batch size [default: 256 on a GPU, 4 on the CPU]");
    app->add_option("--model", db.model, "r50_frozen_head, r18_full or r50_full")
        ->capture_default_str();
    app->add_option(
           "--mode", mode,
           "the end-to-end run's mode:" + tandem::cli::mode_help(tandem::cli::modes_with_auto()))
        ->check(tandem::cli::mode_validator(tandem::cli::modes_with_auto()))
        ->capture_default_str();
    app->add_option("--steps", db.run.steps,
                    "timed end-to-end steps; 0 skips the end-to-end rows [default: 100 on a "
                    "GPU, 4 on the CPU]");
    app->add_option("--warmup", db.run.warmup, "untimed end-to-end steps first");
    app->add_option("--device", db.run.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    app->add_flag("--skip-bad", db.run.skip_bad,
                  "leave files that fail to load out of their batch and report them");
    app->add_option("--json", json, "write the rows as JSON to this file");
  }

  int run(const std::string& command) {
    options.run.workload = tandem::find_reference_workload("images");
    options.run.mode = tandem::run::parse_run_mode(mode);
    return run_data_bench_command(options, json, command);
  }
};
#endif

/// "tandem ARG1 ARG2 ...": the command line, for the reports that record it.
std::string command_line(int argc, char** argv) {
  std::string command = "tandem";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

/// The exit code of a run that threw, after its one line on stderr (TANDEM_DEBUG=1: the whole
/// message; with TORCH_SHOW_CPP_STACKTRACES=1 too, LibTorch's C++ backtrace of where it was
/// thrown, stage threads included).
int exit_code_of(const std::exception_ptr& failure) {
  const bool debug = std::getenv("TANDEM_DEBUG") != nullptr;
  try {
    std::rethrow_exception(failure);
  } catch (const tandem::InvalidArgument& e) {
    std::cerr << tandem::distributed::rank_prefix()
              << "tandem: error: " << tandem::first_line(e.what()) << "\n";
    return kExitUsage;
  } catch (const c10::Error& e) {
    std::cerr << tandem::distributed::rank_prefix() << "tandem: error: "
              << (debug ? std::string(e.what()) : tandem::first_line(e.what_without_backtrace()))
              << "\n";
  } catch (const std::exception& e) {
    std::cerr << tandem::distributed::rank_prefix()
              << "tandem: error: " << (debug ? std::string(e.what()) : tandem::first_line(e.what()))
              << "\n";
  }
  return kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  quiet_libtorch_warnings();
  CLI::App app{"tandem: faster GPU training steps by overlapping their parts on CUDA streams."};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success, 1 the run failed, 2 bad command-line input (bench: a --batch-size\n"
      "or --steps that does not fit in memory included). TANDEM_DEBUG=1 prints whole error\n"
      "messages (with TORCH_SHOW_CPP_STACKTRACES=1, where they were thrown) and LibTorch's\n"
      "warnings.");
  BenchCommand bench;
  bench.add(app);
  SweepCommand sweep;
  sweep.add(app);
  AugmentBenchCommand augment_bench;
  augment_bench.add(app);
#ifdef TANDEM_HAVE_IMAGES
  DataBenchCommand data_bench;
  data_bench.add(app);
  tandem::ShrinkCommand shrink;
  shrink.add(app);
#endif
#ifdef TANDEM_HAVE_TRAIN
  tandem::TrainCommand train_command;
  CLI::App* train = train_command.add(app);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // The help that lists the flag's choices: the subcommand's, where one was named.
    std::string help = "tandem --help";
    for (const CLI::App* sub : app.get_subcommands())
      help = "tandem " + sub->get_name() + " --help";
    std::cerr << "tandem: error: " << tandem::first_line(e.what()) << " (see " << help << ")\n";
    return kExitUsage;
  }
  try {
    // The commands that may decode an image folder on the JPEG engines ask CUDA for the
    // hardware queues the engines' streams need, before this process's first CUDA call
    // (hardware_queues.h). Inside the try: reading --param can name a bad pair.
    if ((bench.app->parsed() && bench.may_decode_on_engines()) ||
        (sweep.app->parsed() && sweep.may_decode_on_engines())
#ifdef TANDEM_HAVE_IMAGES
        || (data_bench.app->parsed() && data_bench.options.decode != "cpu")
#endif
#ifdef TANDEM_HAVE_TRAIN
        || (train->parsed() && train_command.may_decode_on_engines())
#endif
    )
      tandem::ask_for_hardware_queues();
    // The runs' convolution plans (the trained ResNets' with convs=plans: tuned_conv.h) read
    // from the plans file Python's Trainer shares, and written back where a run timed new ones,
    // as this scope ends.
    std::optional<tandem::models::KeptConvPlans> plans;
    if ((bench.app->parsed() && bench.uses_conv_plans()) ||
        (sweep.app->parsed() && sweep.uses_conv_plans())
#ifdef TANDEM_HAVE_TRAIN
        || (train->parsed() && train_command.uses_conv_plans())
#endif
    )
      plans.emplace();
    if (bench.app->parsed()) return bench.run(argc, argv);
    if (sweep.app->parsed()) return sweep.run();
    if (augment_bench.app->parsed()) return augment_bench.run();
#ifdef TANDEM_HAVE_IMAGES
    if (data_bench.app->parsed()) return data_bench.run(command_line(argc, argv));
    if (shrink.app->parsed()) return shrink.run(command_line(argc, argv));
#endif
#ifdef TANDEM_HAVE_TRAIN
    if (train->parsed()) {
      train_command.validate();  // before --nproc starts ranks: one line, not one per rank
      if (auto code = tandem::launch_if_asked(train_command.nproc, argc, argv)) return *code;
      return train_command.run(command_line(argc, argv));
    }
#endif
  } catch (...) {
    return exit_code_of(std::current_exception());
  }
  return 0;
}
