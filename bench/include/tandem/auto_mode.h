// `--mode auto`: short timed trials of every mode of a workload, then the fastest, with a noise
// margin in favour of the simpler mode (workload_modes() lists them simplest first).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/bench.h"

namespace tandem {

struct Trial {
  std::string mode;
  std::optional<double> steps_per_s;  ///< trial_rate(runs); nullopt when the trial failed
  std::string error;                  ///< why it failed
  std::vector<double> runs;           ///< steps/s of each measured run (a fresh instance each)
};

struct AutoDecision {
  std::string mode;
  std::string reason;
};

/// Trials are in workload_modes()' order (simplest first). The pick is the first mode whose rate is
/// within `margin` (relative) of the fastest: a mode must beat a simpler one by more than the
/// noise to be chosen. Failed trials are skipped; throws std::runtime_error if all failed.
AutoDecision choose_mode(const std::vector<Trial>& trials, double margin = 0.015);

/// Trial length. Each mode first runs kAutoTrialWarmup + kAutoTrialSteps steps (fewer if the
/// run asks for fewer); a mode whose timed steps took less than kAutoTrialSeconds then runs
/// with enough steps to fill that time (at most kAutoTrialMaxSteps). Why: a pipeline's fill and
/// drain fall inside a short timed window and cost a pipelined mode a few percent against a
/// serial one; on the H200, 20-step trials made cls pick gpu_aug where pipelined+graphed ran 9%
/// faster.
/// Each mode is measured kAutoTrialRuns times, each run a fresh instance (models, threads,
/// cuDNN's choices, graphs), and ranked by its slowest run (trial_rate): on the H200, seg's eager
/// pipelined mode at batch 8 ran anywhere from 289 to 328 steps/s from one instance to the next
/// while pipelined+graphed held 327, and a single trial picked the unsteady mode. The trials
/// of a workload with M modes take about M x (1 short + kAutoTrialRuns sized runs), model
/// set-up included.
inline constexpr int64_t kAutoTrialWarmup = 5;
inline constexpr int64_t kAutoTrialSteps = 20;
inline constexpr double kAutoTrialSeconds = 0.6;
inline constexpr int64_t kAutoTrialMaxSteps = 300;
inline constexpr int kAutoTrialRuns = 2;

/// A mode's trial rate from its runs: the slowest, so a mode is ranked by what it can be
/// counted on for, not by its luckiest instance. 0 for no runs.
double trial_rate(const std::vector<double>& runs);

/// Timed steps of the second trial of a mode whose first, of `steps` steps, ran at
/// `steps_per_s`: enough for kAutoTrialSeconds, at most kAutoTrialMaxSteps and at most `cap`
/// (the run's own step count); 0 when the first trial already lasted long enough.
int64_t second_trial_steps(int64_t steps, double steps_per_s, int64_t cap);

struct AutoResult {
  std::vector<Trial> trials;
  AutoDecision decision;
  double trial_seconds = 0;  ///< wall time of all trials, model set-up included
  BenchResult result;        ///< the full run of the picked mode
};

/// The trials alone: each mode of workload_modes() measured as described above, in that
/// order; a mode that fails has its error instead of a rate. Adds the wall time of all trials,
/// model set-up included, to `*seconds` when given. Prints nothing.
std::vector<Trial> run_trials(const BenchOptions& options, double* seconds = nullptr);

/// Runs the trials for options.workload, prints nothing, then the full run of the pick.
/// `options.mode` is ignored.
AutoResult run_auto(const BenchOptions& options);

}  // namespace tandem
