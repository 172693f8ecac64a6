// The tandem CLI: parse flags, call the library, print. Exit codes: 0 success, 1 the run failed,
// 2 bad command-line input (one line on stderr naming the value and what was expected).
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "tandem/bench.h"
#include "tandem/error.h"
#include "tandem/scenario.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

int run_bench_command(tandem::BenchOptions options, const std::string& json_path) {
  options = tandem::resolve(options);
  std::ofstream json;
  if (!json_path.empty()) {  // fail now, not after a long run
    json.open(json_path);
    if (!json)
      throw tandem::InvalidArgument("JSON path '" + json_path +
                                    "' cannot be written: " + std::strerror(errno));
  }
  if (!options.trace_path.empty() && !std::ofstream(options.trace_path))
    throw tandem::InvalidArgument("trace path '" + options.trace_path +
                                  "' cannot be written: " + std::strerror(errno));
  std::cout << tandem::describe_config(options) << std::flush;
  const tandem::BenchResult result = tandem::run_bench(options);
  std::cout << "\n" << tandem::describe_result(result) << std::flush;
  if (json.is_open()) {
    json << tandem::to_json(result).dump(2) << "\n";
    if (!json) throw std::runtime_error("writing JSON to '" + json_path + "' failed");
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem: faster GPU training steps by overlapping their parts on CUDA streams."};
  app.require_subcommand(1);
  app.footer("Exit codes: 0 success, 1 the run failed, 2 bad command-line input.");

  tandem::BenchOptions options;
  std::string json_path;
  int64_t batch_size = 0, steps = 0, warmup = 0;
  int workers = 0;
  CLI::App* bench = app.add_subcommand(
      "bench", "Train a reference workload in one mode and report steps/s (SPEC's method: "
               "warm-up steps, then timed steps between device synchronizations).");
  bench->add_option("--scenario", options.scenario,
                    "workload: " + tandem::join_choices(tandem::scenario_names()))
      ->capture_default_str();
  bench->add_option("--mode", options.mode, "mode of the scenario (seg: serial or pipelined)")
      ->capture_default_str();
  CLI::Option* batch_size_opt = bench->add_option("--batch-size", batch_size,
                    "samples per step [default: 8 on a GPU, 2 on the CPU]");
  CLI::Option* steps_opt = bench->add_option("--steps", steps, "timed steps [default: 100 on a GPU, 4 on the CPU]");
  CLI::Option* warmup_opt = bench->add_option("--warmup", warmup,
                    "untimed warm-up steps [default: 10 on a GPU, 1 on the CPU]");
  CLI::Option* workers_opt = bench->add_option("--workers", workers,
                    "loader worker threads [default: 8 on a GPU, 2 on the CPU]");
  bench->add_option("--seed", options.seed, "seed for models and data")->capture_default_str();
  bench->add_option("--device", options.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  bool cudnn_benchmark = false;
  CLI::Option* cudnn_opt = bench->add_flag(
      "--cudnn-benchmark,!--no-cudnn-benchmark", cudnn_benchmark,
      "let cuDNN autotune convolution algorithms [default: on with CUDA]");
  bench->add_option("--train-priority", options.train_priority,
                    "stream priority of the training lane: high or normal")
      ->capture_default_str();
  bench->add_option("--trace", options.trace_path,
                    "write a Chrome-trace timeline of the timed steps to this file "
                    "(open in ui.perfetto.dev or chrome://tracing)");
  bench->add_option("--json", json_path, "also write the result as JSON to this file");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "tandem: error: " << first_line(e.what()) << " (see tandem --help)\n";
    return kExitUsage;
  }

  // Flags not given stay unset, so the library picks the device's defaults.
  if (batch_size_opt->count()) options.batch_size = batch_size;
  if (steps_opt->count()) options.steps = steps;
  if (warmup_opt->count()) options.warmup = warmup;
  if (workers_opt->count()) options.workers = workers;
  if (cudnn_opt->count()) options.cudnn_benchmark = cudnn_benchmark;

  try {
    if (bench->parsed()) return run_bench_command(options, json_path);
  } catch (const tandem::InvalidArgument& e) {
    std::cerr << "tandem: error: " << first_line(e.what()) << "\n";
    return kExitUsage;
  } catch (const c10::Error& e) {
    std::cerr << "tandem: error: " << first_line(e.what_without_backtrace()) << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "tandem: error: " << first_line(e.what()) << "\n";
    return kExitFailure;
  }
  return 0;
}
