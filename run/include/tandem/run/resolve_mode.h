// Mode auto, for every front end: short timed trials of every mode of a workload, then the
// fastest, with a noise margin in favour of the simpler mode (workload_modes() lists them simplest
// first). resolve_mode() is the one place a request's mode becomes the mode that runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/run/run_workload.h"

namespace tandem::run {

struct Trial {
  std::string mode;
  std::optional<double> steps_per_s;  ///< trial_rate(runs); nullopt when the trial failed
  std::string error;                  ///< why it failed
  std::vector<double> runs;           ///< steps/s of each measured run (a fresh instance each)
};

struct ModeDecision {
  std::string mode;
  std::string reason;
};

/// Trials in any order; simplest means earlier in workload_modes(). The pick is the first mode
/// whose rate is within the noise margin (relative) of the fastest: a mode must beat a simpler one
/// by more than the noise to be chosen. The margin is what the two trials' runs measured of their
/// own noise (noise_margin), at least `min_margin` and at most `margin`; a trial of one run
/// measured none, and is given `margin`. Why not a fixed 1.5%: on the H200, ViT-B/16's graphed
/// trials ran 0.9% above serial's, run after run with spreads near 0.1%, and the fixed margin kept
/// the slower serial mode. Failed trials are skipped; throws std::runtime_error if all failed.
ModeDecision choose_mode(const std::vector<Trial>& trials, double margin = 0.015,
                         double min_margin = 0.005);

/// What a front end knows of a job, before anything runs, that rules modes out.
struct ModeConstraints {
  /// The run keeps a per-step schedule, checkpoints and stops (a run folder: `tandem train`,
  /// tandem.Trainer(out=...)): graphed_k's K steps per replay would cut through them.
  bool run_folder = false;
  /// The job runs on CUDA: a graph that keeps a float lr is a problem only where graphs run.
  bool cuda = false;
  /// The optimizer's step keeps no host-side state a CUDA graph would freeze.
  bool capturable = true;
  /// An lr schedule sets the learning rate between steps, and the optimizer reads it from host
  /// memory (a float lr, baked into a captured step) rather than from the device.
  bool lr_schedule_on_host = false;
  std::string optimizer = "the optimizer";  ///< its name, for the messages
  /// What the front end's user can do about each (the messages end with it), e.g. which of
  /// its optimizers are capturable; empty: the C++ API's advice.
  std::string capturable_advice, lr_advice;
};

/// Why `mode` cannot run a job with these constraints ("" when it can) — the one rule of which
/// modes a job allows, asked by every front end (`tandem train`'s modes, tandem.Trainer's
/// explicit mode and mode auto's candidates; the Runner refuses the same at its start).
std::string mode_problem(Mode mode, const ModeConstraints& constraints);

/// The order auto times modes in: pipelined+graphed, graphed, graphed_k, serial, pipelined. The
/// graphed modes come first because what they measure decides whether the others need a trial
/// at all (needs_no_trial); pipelined+graphed first because, where a step has stages to overlap
/// and is not short, it leaves graphed untimed too: one trial, one warm-up (cuDNN tunes its
/// plans per thread, and each further trial's stage threads tune theirs again).
const std::vector<Mode>& trial_order();

/// A step this short is where the host's per-step work (a graph launch, a pipeline's
/// hand-offs) is within reach of the trials' noise: graphed_k is timed only beside a graphed
/// step shorter than this, and graphed beside a pipelined+graphed one. Measured: on steps of
/// 3.7 ms and more (ResNet-18 at batch 32 and up, ViT-B/16, frozen ResNet-50) graphed_k ran
/// 8-30% below graphed in every trial; pipelined+graphed ran from 1.5% below graphed to 9.6%
/// above it in every Trainer trial on record (H100 and H200, 2026-11/12: ResNets, MobileNetV3,
/// ViT-B/16, compiled and not).
inline constexpr double kShortStepSeconds = 1e-3;

/// Why a trial of `mode` could not change auto's pick, given the trials so far (`so_far`, any
/// order, a mode's rate where it was timed): empty when it could, so it is timed. A mode is left
/// untimed when
///  - it pipelines a step with one stage (`stages_to_overlap` false: no loader's host work, no
///    feed): a pipeline adds hand-offs to serial's step and overlaps nothing;
///  - it is graphed and pipelined+graphed ran steps of `short_step_s` or longer: the same
///    graphs with the stages overlapped, within the noise of graphed or faster;
///  - a graphed counterpart ran (serial beside graphed or pipelined+graphed, pipelined beside
///    pipelined+graphed): replaying a captured step runs the same kernels without launching
///    them from the host, so it is at least as fast (every trial measured agrees: ResNets,
///    ViT-B/16, the reference workloads), and the noise margin that would favour the simpler
///    mode favours the faster;
///  - it is graphed_k and graphed failed (the same capture) or the graphed step (graphed's, else
///    pipelined+graphed's) took `short_step_s` or longer.
std::string needs_no_trial(Mode mode, const std::vector<Trial>& so_far, bool stages_to_overlap,
                           double short_step_s = kShortStepSeconds);

/// The relative spread of a trial's runs, (fastest - slowest) / fastest; nullopt for fewer than
/// two runs (no measure of the noise).
std::optional<double> run_spread(const std::vector<double>& runs);

/// The margin by which `faster` must beat the simpler `simpler` to be chosen: the larger run
/// spread of the two, clamped to [min_margin, margin]; `margin` when either has fewer than two
/// runs.
double noise_margin(const Trial& simpler, const Trial& faster, double margin, double min_margin);

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

/// The trials alone: each mode of trial_order() measured as described above, in that order,
/// unless needs_no_trial says its trial could not change the pick (RunRequest::stages_to_overlap);
/// a mode that fails has its error instead of a rate, an untimed one "not timed: " and why.
/// Returned in workload_modes()' order. Adds the wall time of all trials,
/// model set-up included, to `*seconds` when given. Prints nothing. A cancelled trial (hooks)
/// stops them all.
std::vector<Trial> run_trials(const RunRequest& request, const RunHooks& hooks = {},
                              double* seconds = nullptr);

struct ModeResolution {
  Mode mode = Mode::kSerial;  ///< the mode to run
  /// Why: the trials' pick, or "asked for" when the request named its mode.
  ModeDecision decision;
  std::vector<Trial> trials;  ///< empty when the request named its mode
  double trial_seconds = 0;   ///< wall time of all trials, model set-up included
};

/// The request's mode when it names one (InvalidArgument with its reason when the request rules
/// it out); for auto, the trials' pick (choose_mode) among the modes not ruled out. Prints
/// nothing.
ModeResolution resolve_mode(const RunRequest& request, const RunHooks& hooks = {});

/// Mode auto for a run too long for trials to pay (`tandem train`: epochs of one mode, where a
/// trial of every mode would cost minutes for a choice the device settles): pipelined+graphed
/// on a GPU, serial on the CPU, with that reason. A named mode is returned as asked for.
ModeResolution resolve_mode_by_device(const RunMode& mode, const c10::Device& device);

/// The trials' report: {"picked", "reason", "trial_seconds", "trials": [{"mode", "steps_per_s"
/// (null for a failed trial), "runs", "error"}]}.
nlohmann::json to_json(const ModeResolution& resolution);

struct AutoReport {
  ModeResolution resolution;
  RunReport report;  ///< the full run of the resolved mode
};

/// resolve_mode(), then the full run of its mode.
AutoReport run_auto(const RunRequest& request, const RunHooks& hooks = {});

}  // namespace tandem::run
