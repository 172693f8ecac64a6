// `tandem sweep`: every mode of a workload at every batch size, in one process, reported as a
// fixed-width table, CSV, JSON and an SVG chart — the articles' sensitivity tables, measured.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tandem/run/request.h"

namespace tandem::run {

struct SweepOptions {
  std::vector<std::string> modes;    ///< mode names, may include "auto"; "all" or empty: every
  std::vector<int64_t> batch_sizes;  ///< at least one, each > 0
  RunRequest base;                   ///< workload, device, steps, warm-up, workers, seed, ...
  /// Runs of every point, each on a fresh instance, the modes of a batch size taking turns
  /// (round 1: every mode, round 2: every mode, ...); a point reports the median. Some modes'
  /// rates differ by 15% between instances (seg's eager pipelined mode at batch 8 on the H200),
  /// so one run decides little when two modes are within a few percent.
  int rounds = 1;
};

struct SweepRow {
  std::string mode;
  int64_t batch_size = 0;
  std::optional<double> steps_per_s, samples_per_s;
  std::optional<double> speedup;          ///< over the workload's serial baseline, same batch
  std::optional<double> efficiency;       ///< steps_per_s / floor rate (see run_sweep)
  std::optional<double> gpu_utilization;  ///< NVML mean over the timed steps, percent
  std::string picked;                     ///< for mode "auto": the mode it ran (each round's,
                                          ///< comma-separated, where rounds chose differently)
  std::string error;                      ///< why this point failed (the sweep goes on)
  std::vector<double> round_rates;        ///< steps/s of each round, in order
  bool refused = false;  ///< it failed on its input before running (InvalidArgument: exit 2)
  /// The samples skip_bad left out of its runs (the first round's), "sample N: why".
  std::vector<std::string> skipped;
};

/// The median of `values` (the mean of the middle two for an even count); nullopt when empty.
std::optional<double> median(std::vector<double> values);

/// Runs every (batch size, mode), options.rounds times. The baseline (serial)
/// is run first at each batch size in each round, added if the caller did not ask for it:
/// speedups are relative to its median rate, and its slowest stage's device time (no other lane
/// competing; the median over rounds) is the floor for that batch size. A point that fails in
/// any round reports that round's error. on_row is called as each point's last round ends.
std::vector<SweepRow> run_sweep(const SweepOptions& options,
                                const std::function<void(const SweepRow&)>& on_row = {});

/// The rows as a table, then a line for each point that skipped samples (skip_bad), naming the
/// first.
std::string sweep_table(const std::vector<SweepRow>& rows);
/// Throws when every point failed, with the first's error: InvalidArgument where each failed on
/// its input (the CLI's exit 2), tandem::Error otherwise (exit 1). A sweep whose points all
/// failed measured nothing; one with some points left is a sweep (a row says why each failed).
void check_some_point_ran(const std::vector<SweepRow>& rows);
/// Header "mode,batch_size,steps_per_s,samples_per_s,speedup,efficiency,gpu_utilization,
/// picked,error", then one line per row; empty fields where a value is absent.
std::string sweep_csv(const std::vector<SweepRow>& rows);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows, const SweepOptions& options);
/// A line chart of steps/s (or, with `speedup`, speedup) against batch size, one series (a
/// <g class="series" data-mode="..."> with a polyline) per mode, with axes and a legend.
std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title,
                      bool speedup = false);

}  // namespace tandem::run
