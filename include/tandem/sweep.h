// `tandem sweep`: every mode of a scenario at every batch size, in one process, reported as a
// fixed-width table, CSV, JSON and an SVG chart — the articles' sensitivity tables, measured.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/bench.h"

namespace tandem {

struct SweepOptions {
  std::vector<std::string> modes;    ///< may include "auto"; "all" or empty: the scenario's
  std::vector<int64_t> batch_sizes;  ///< at least one, each > 0
  BenchOptions base;                 ///< scenario, device, steps, warm-up, workers, seed, ...
};

struct SweepRow {
  std::string mode;
  int64_t batch_size = 0;
  std::optional<double> steps_per_s, samples_per_s;
  std::optional<double> speedup;          ///< over the scenario's serial baseline, same batch
  std::optional<double> efficiency;       ///< steps_per_s / floor rate (see run_sweep)
  std::optional<double> gpu_utilization;  ///< NVML mean over the timed steps, percent
  std::string picked;                     ///< for mode "auto": the mode it ran
  std::string error;                      ///< why this point failed (the sweep goes on)
};

/// Runs every (batch size, mode). The scenario's baseline (its first mode) is run first at each
/// batch size, added if the caller did not ask for it: speedups are relative to it, and its
/// slowest stage's device time (no other lane competing) is the floor for that batch size.
std::vector<SweepRow> run_sweep(const SweepOptions& options,
                                const std::function<void(const SweepRow&)>& on_row = {});

std::string sweep_table(const std::vector<SweepRow>& rows);
/// Header "mode,batch_size,steps_per_s,samples_per_s,speedup,efficiency,gpu_utilization,
/// picked,error", then one line per row; empty fields where a value is absent.
std::string sweep_csv(const std::vector<SweepRow>& rows);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows, const SweepOptions& options);
/// A line chart of steps/s (or, with `speedup`, speedup) against batch size, one series (a
/// <g class="series" data-mode="..."> with a polyline) per mode, with axes and a legend.
std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title,
                      bool speedup = false);

}  // namespace tandem
