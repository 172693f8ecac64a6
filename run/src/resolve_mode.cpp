// Trials and the choice behind mode auto.
#include "tandem/run/resolve_mode.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "tandem/error.h"
#include "tandem/mode.h"

namespace tandem::run {

std::optional<double> run_spread(const std::vector<double>& runs) {
  if (runs.size() < 2) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  return *hi > 0 ? (*hi - *lo) / *hi : 0.0;
}

double noise_margin(const Trial& simpler, const Trial& faster, double margin, double min_margin) {
  const auto a = run_spread(simpler.runs), b = run_spread(faster.runs);
  if (!a || !b) return margin;
  return std::clamp(std::max(*a, *b), std::min(min_margin, margin), margin);
}

namespace {

// A mode's place in workload_modes() (simplest first); unknown names after every mode.
size_t simplicity(const std::string& name) {
  const auto& modes = workload_modes();
  for (size_t i = 0; i < modes.size(); ++i)
    if (name == to_string(modes[i])) return i;
  return modes.size();
}

// In workload_modes()' order, simplest first: the order choose_mode's rule walks.
void sort_simplest_first(std::vector<Trial>& trials) {
  std::stable_sort(trials.begin(), trials.end(), [](const Trial& a, const Trial& b) {
    return simplicity(a.mode) < simplicity(b.mode);
  });
}

// "MODE's step takes X ms: REST", for a mode left untimed beside a graphed step that long.
std::string step_text(const char* what, double steps_per_s, const char* rest) {
  char text[200];
  std::snprintf(text, sizeof text, "%s's step takes %.2f ms: %s", what, 1e3 / steps_per_s, rest);
  return text;
}

const Trial* find_trial(const std::vector<Trial>& trials, Mode mode) {
  for (const auto& t : trials)
    if (t.mode == to_string(mode)) return &t;
  return nullptr;
}

}  // namespace

std::string mode_problem(Mode mode, const ModeConstraints& c) {
  const std::string name = to_string(mode);
  if (mode == Mode::kGraphedK && c.run_folder)
    return "mode 'graphed_k' replays K steps per graph, which would cut through a run folder's "
           "per-step schedule, checkpoints and stops: use 'pipelined+graphed' or 'graphed'";
  if (!captures_graphs(mode)) return "";
  if (c.cuda && c.lr_schedule_on_host)
    return "mode '" + name + "' replays a CUDA graph, which keeps the float lr of " + c.optimizer +
           " it was captured with, so the lr schedule could not change it: " +
           (c.lr_advice.empty() ? "use tandem::optim::Sgd, Adam or AdamW" : c.lr_advice) +
           ", or mode 'pipelined'";
  if (!c.capturable)
    return "mode '" + name + "' captures the training step into a CUDA graph, but " + c.optimizer +
           " keeps host-side state a graph would freeze: " +
           (c.capturable_advice.empty() ? "use tandem::optim::Sgd, Adam or AdamW"
                                        : c.capturable_advice) +
           ", or mode 'pipelined'";
  return "";
}

const std::vector<Mode>& trial_order() {
  static const std::vector<Mode> order{Mode::kPipelinedGraphed, Mode::kGraphed, Mode::kGraphedK,
                                       Mode::kSerial, Mode::kPipelined};
  return order;
}

std::string needs_no_trial(Mode mode, const std::vector<Trial>& so_far, bool stages_to_overlap,
                           double short_step_s) {
  const auto timed = [&](Mode m) -> const Trial* {
    const Trial* t = find_trial(so_far, m);
    return t && t->steps_per_s && *t->steps_per_s > 0 ? t : nullptr;
  };
  const auto failed = [&](Mode m) {
    const Trial* t = find_trial(so_far, m);
    return t && !t->steps_per_s && t->error.rfind("not timed: ", 0) != 0;
  };
  if (runs_pipelined(mode) && !stages_to_overlap)
    return "one stage (no loader or feed to overlap): a pipeline would add hand-offs to the "
           "serial step";
  const Trial* graphed = timed(Mode::kGraphed);
  const Trial* pipelined_graphed = timed(Mode::kPipelinedGraphed);
  if (mode == Mode::kGraphed && pipelined_graphed &&
      *pipelined_graphed->steps_per_s * short_step_s < 1.0)
    return step_text("pipelined+graphed", *pipelined_graphed->steps_per_s,
                     "it replays this step's graphs with its stages overlapped, within the "
                     "trials' noise of graphed or faster on steps this long");
  if (mode == Mode::kSerial && (graphed || pipelined_graphed))
    return std::string(graphed ? "graphed" : "pipelined+graphed") +
           " replays this step's kernels from captured graphs, without host launches";
  if (mode == Mode::kPipelined && pipelined_graphed)
    return "pipelined+graphed replays these stages' kernels from captured graphs, without host "
           "launches";
  if (mode == Mode::kGraphedK) {
    if (failed(Mode::kGraphed))
      return "graphed could not run, and graphed_k captures the same step";
    const Trial* step = graphed ? graphed : pipelined_graphed;
    if (step && *step->steps_per_s * short_step_s < 1.0)
      return step_text(graphed ? "graphed" : "pipelined+graphed", *step->steps_per_s,
                       "K steps a replay would save only the host's per-step work, within the "
                       "trials' noise");
  }
  return "";
}

ModeDecision choose_mode(const std::vector<Trial>& unordered, double margin, double min_margin) {
  std::vector<Trial> trials = unordered;
  sort_simplest_first(trials);
  const Trial* best = nullptr;
  for (const auto& t : trials)
    if (t.steps_per_s && (!best || *t.steps_per_s > *best->steps_per_s)) best = &t;
  if (!best) {
    std::string why;
    for (const auto& t : trials) why += (why.empty() ? "" : "; ") + t.mode + ": " + t.error;
    throw Error("auto: every mode failed its trial (" + why + ")");
  }
  char text[256];
  for (const auto& t : trials) {
    const double noise = noise_margin(t, *best, margin, min_margin);
    if (!t.steps_per_s || *t.steps_per_s < *best->steps_per_s * (1.0 - noise)) continue;
    if (&t == best) {
      std::snprintf(text, sizeof text, "%s was fastest in the trials (%.1f steps/s)",
                    t.mode.c_str(), *t.steps_per_s);
    } else {
      std::snprintf(text, sizeof text,
                    "%s (%.1f steps/s) is within %.1f%% of the fastest, %s (%.1f), and simpler",
                    t.mode.c_str(), *t.steps_per_s, noise * 100, best->mode.c_str(),
                    *best->steps_per_s);
    }
    return {t.mode, text};
  }
  return {best->mode, "fastest"};  // unreachable: best is within its own margin
}

double trial_rate(const std::vector<double>& runs) {
  return runs.empty() ? 0.0 : *std::min_element(runs.begin(), runs.end());
}

int64_t second_trial_steps(int64_t steps, double steps_per_s, int64_t cap) {
  if (!(steps_per_s > 0) || static_cast<double>(steps) >= kAutoTrialSeconds * steps_per_s) return 0;
  const auto wanted = static_cast<int64_t>(std::ceil(kAutoTrialSeconds * steps_per_s));
  const int64_t longer = std::min({wanted, kAutoTrialMaxSteps, cap});
  return longer > steps ? longer : 0;
}

namespace {

// What a finished trial freed stays cached in the allocator's general pool, and a graph capture
// cannot give cached blocks back to the device (cudaFree would end the capture): a mode that
// captures after trials that did not could run out of memory beside memory cached and unused
// (ViT-B/16 at batch size 256 on an H200: 100 GiB cached, graphed failed). Released after every
// trial; the run's own warm-up fills the cache again.
void release_cached_memory(const RunRequest& options) {
  if (options.device.rfind("cuda", 0) == 0 && at::cuda::is_available())
    c10::cuda::CUDACachingAllocator::emptyCache();
}

}  // namespace

std::vector<Trial> run_trials(const RunRequest& unresolved, const RunHooks& hooks,
                              double* seconds) {
  const RunRequest options = resolve(unresolved);
  std::vector<Trial> trials;
  const auto start = std::chrono::steady_clock::now();
  for (const Mode mode : trial_order()) {
    RunRequest trial = options;
    trial.mode = mode;
    trial.steps = std::min(*options.steps, kAutoTrialSteps);
    trial.warmup = std::min(*options.warmup, kAutoTrialWarmup);
    trial.trace_path.clear();
    trial.kernel_steps = 0;  // the picked mode's run lists its kernels (and writes their trace)
    trial.kernel_trace_path.clear();
    trial.progress = false;
    Trial t{to_string(mode), std::nullopt, "", {}};
    if (const auto no = options.ruled_out.find(mode); no != options.ruled_out.end()) {
      t.error = no->second;  // not tried: this run cannot take it
      trials.push_back(t);
      continue;
    }
    if (const auto why = needs_no_trial(mode, trials, options.stages_to_overlap); !why.empty()) {
      t.error = "not timed: " + why;
      trials.push_back(t);
      continue;
    }
    try {
      const double first = run_workload(trial, hooks).steps_per_s;  // sizes the measured runs
      const int64_t longer = second_trial_steps(*trial.steps, first, *options.steps);
      if (longer > 0)
        trial.steps = longer;
      else
        t.runs.push_back(first);  // already long enough: it counts as a run
      while (static_cast<int>(t.runs.size()) < kAutoTrialRuns)
        t.runs.push_back(run_workload(trial, hooks).steps_per_s);
      t.steps_per_s = trial_rate(t.runs);
    } catch (const std::exception& e) {
      // A cancelled run is the caller's stop, not this mode's failure.
      if (hooks.cancel && hooks.cancel->load()) throw;
      t.error = first_line(e.what());
    }
    release_cached_memory(options);
    trials.push_back(t);
  }
  if (seconds)
    *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sort_simplest_first(trials);
  return trials;
}

ModeResolution resolve_mode(const RunRequest& request, const RunHooks& hooks) {
  ModeResolution out;
  if (request.mode) {
    if (const auto no = request.ruled_out.find(*request.mode); no != request.ruled_out.end())
      throw InvalidArgument(no->second);
    out.mode = *request.mode;
    out.decision = {to_string(*request.mode), "asked for"};
    return out;
  }
  out.trials = run_trials(request, hooks, &out.trial_seconds);
  out.decision = choose_mode(out.trials);
  out.mode = parse_mode(out.decision.mode);
  return out;
}

ModeResolution resolve_mode_by_device(const RunMode& mode, const c10::Device& device) {
  ModeResolution out;
  if (mode) {
    out.mode = *mode;
    out.decision = {to_string(*mode), "asked for"};
    return out;
  }
  out.mode = device.is_cuda() ? Mode::kPipelinedGraphed : Mode::kSerial;
  out.decision = {to_string(out.mode),
                  device.is_cuda() ? "on a GPU: each stage on its own stream, replaying its graph"
                                   : "on the CPU: no CUDA streams or graphs to gain from"};
  return out;
}

nlohmann::json to_json(const ModeResolution& r) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : r.trials)
    trials.push_back(
        {{"mode", t.mode},
         {"steps_per_s", t.steps_per_s ? nlohmann::json(*t.steps_per_s) : nlohmann::json(nullptr)},
         {"runs", t.runs},
         {"error", t.error}});
  return {{"picked", r.decision.mode},
          {"reason", r.decision.reason},
          {"trial_seconds", r.trial_seconds},
          {"trials", trials}};
}

AutoReport run_auto(const RunRequest& request, const RunHooks& hooks) {
  AutoReport out;
  out.resolution = resolve_mode(request, hooks);
  RunRequest picked = request;
  picked.mode = out.resolution.mode;
  out.report = run_workload(picked, hooks);
  return out;
}

}  // namespace tandem::run
