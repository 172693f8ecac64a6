// `--mode auto`: short timed trials of every mode of a scenario, then the fastest, with a noise
// margin in favour of the simpler mode (the scenario lists its modes simplest first).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/bench.h"

namespace tandem {

struct Trial {
  std::string mode;
  std::optional<double> steps_per_s;  ///< nullopt when the trial failed
  std::string error;                  ///< why it failed
};

struct AutoDecision {
  std::string mode;
  std::string reason;
};

/// Trials are in the scenario's order (simplest first). The pick is the first mode whose rate is
/// within `margin` (relative) of the fastest: a mode must beat a simpler one by more than the
/// noise to be chosen. Failed trials are skipped; throws std::runtime_error if all failed.
AutoDecision choose_mode(const std::vector<Trial>& trials, double margin = 0.015);

/// Trial length: at most this many warm-up and timed steps per mode (fewer if the run asks
/// for fewer), so the trials of a scenario with M modes cost about M short runs.
inline constexpr int64_t kAutoTrialWarmup = 5;
inline constexpr int64_t kAutoTrialSteps = 20;

struct AutoResult {
  std::vector<Trial> trials;
  AutoDecision decision;
  double trial_seconds = 0;  ///< wall time of all trials, model set-up included
  BenchResult result;        ///< the full run of the picked mode
};

/// Runs the trials for options.scenario, prints nothing, then the full run of the pick.
/// `options.mode` is ignored.
AutoResult run_auto(const BenchOptions& options);

}  // namespace tandem
