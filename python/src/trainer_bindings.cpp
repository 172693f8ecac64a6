// tandem._C's timed runs behind tandem.Trainer's benchmark() and mode auto (tandem/trainer.py): a
// Workload made of the user's Python modules — feed stages (no grad), the model and loss
// function, a Python or tandem optimizer — run by tandem's runner in any mode through the run
// layer (run_workload: the CLI's timing, stage report, floor, trace and progress line;
// resolve_mode: mode auto's trials). fit() trains through train_bindings.cpp's loop.
//
// Threads and the GIL: a run goes on a C++ thread of its own; the calling thread releases the
// GIL and only wakes every 100 ms to let Python handle signals (Ctrl-C cancels the run at its
// next step). The runner's lane threads take the GIL only inside a Python call (PythonCalls):
// eager steps call the user's modules there; a graphed stage calls them while it warms up and
// while it is captured, then replays its CUDA graph with no Python and no GIL at all.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <string>

#include "job.h"
#include "python_workload.h"
#include "tandem/run/data_parallel.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/run/run_workload.h"
#include "tandem/workload.h"

namespace py = pybind11;

namespace tandem::python {
namespace {

/// One run of a tandem.Trainer's config: a request whose workload is the Trainer's modules, its
/// hooks, and the run's Python calls and cancel flag, which outlive the request's copies.
struct PreparedRun {
  std::shared_ptr<PythonCalls> calls = std::make_shared<PythonCalls>();
  std::atomic<bool> cancel{false};
  run::RunRequest request;
  run::RunHooks hooks;
  std::shared_ptr<distributed::ProcessGroup> job;  // data parallel: this process's job
  explicit PreparedRun(const RunConfig& config) {
    RunConfig c = config;
    if (c.data_parallel) {
      job = current_job();
      TANDEM_CHECK_ARG(job != nullptr,
                       "a data-parallel run before its process joined the job "
                       "(tandem.distributed joins it first)");
      run::apply_data_parallel(c.request, hooks, job);
    }
    const auto apply_lr = std::make_shared<PyRef>();
    c.request.workload = workload_entry(c, calls, apply_lr);
    hooks.cancel = &cancel;
    if (c.lr_schedule)  // on the train lane, before the step: set_lr is ordered before it
      hooks.before_train_step = [calls = calls, apply_lr](int64_t step) {
        calls->call("lr_schedule", [&] { (**apply_lr)(step); });
      };
    request = c.request;
  }
  /// run_interruptible(f) with the cuDNN benchmark switch put back afterwards.
  template <typename R, typename F>
  R interruptibly(F f) {
    const KeepCudnnBenchmark keep;
    return run_interruptible<R>(
        f, [this] { cancel = true; }, *calls);
  }
};

}  // namespace

py::dict run(const RunConfig& config) {
  PreparedRun p(config);
  run::RunReport r = p.interruptibly<run::RunReport>([&] {
    try {
      return run::run_workload(p.request, p.hooks);
    } catch (...) {
      // This rank stops; its collectives with the others are out of step for good. Leave the
      // job at once (when this run lets go of the group) rather than at the exit, after the
      // others waited for it there.
      if (p.job) abandon_job();
      throw;
    }
  });
  nlohmann::json block;
  if (p.job) {
    py::gil_scoped_release no_gil;  // waits for the other ranks' runs to end
    block = run::reduce_over_ranks(r, *p.job);
  }
  py::dict out = to_python(run::to_json(r));
  out["losses"] = r.losses;
  out["table"] = run::describe_report(r);
  if (p.job) {
    out["data_parallel"] = to_python(block);
    out["table"] = run::describe_data_parallel(block) + "\n\n" + out["table"].cast<std::string>();
  }
  return out;
}

// WorkloadOptions::data_seed for a seed and a rank: what the CLI's workloads draw their data and
// augmentation from, so a Trainer's ranks draw as theirs do.
uint64_t data_seed(uint64_t seed, int rank) {
  WorkloadOptions o;
  o.seed = seed;
  o.rank = rank;
  return o.data_seed();
}

py::dict trials(const RunConfig& config) {
  PreparedRun p(config);
  p.request.mode = std::nullopt;  // auto
  run::ModeResolution resolution;
  try {
    // Under a launch each rank times the modes alone, then every rank takes rank 0's pick.
    resolution = p.interruptibly<run::ModeResolution>([&] {
      return p.job ? run::resolve_mode_as_rank(p.request, p.hooks, *p.job)
                   : run::resolve_mode(p.request, p.hooks);
    });
  } catch (const py::error_already_set&) {
    throw;
  } catch (const RunError&) {  // a cancel
    throw;
  } catch (const InvalidArgument&) {  // a bad setting, reported as without auto
    throw;
  } catch (const Error& e) {  // every mode failed its trial
    throw py::value_error(std::string("mode auto: ") + e.what());
  }
  const nlohmann::json j = run::to_json(resolution);
  py::dict out;
  out["trials"] = to_python(j.at("trials"));
  out["seconds"] = resolution.trial_seconds;
  out["mode"] = resolution.decision.mode;
  out["reason"] = resolution.decision.reason;
  return out;
}

/// Mode auto's pick among trials a front end measured itself (the Trainer's trials that train),
/// by the run layer's one rule (run::choose_mode): each trial {"mode", "runs": [steps/s, ...],
/// "error"}; returns {"mode", "reason"}.
std::vector<run::Trial> trials_from(const py::list& trials) {
  std::vector<run::Trial> ts;
  for (const py::handle h : trials) {
    const py::dict d = py::reinterpret_borrow<py::dict>(h);
    run::Trial t;
    t.mode = d["mode"].cast<std::string>();
    t.runs = d["runs"].cast<std::vector<double>>();
    t.error = d.contains("error") ? d["error"].cast<std::string>() : std::string();
    if (!t.runs.empty()) t.steps_per_s = run::trial_rate(t.runs);
    ts.push_back(std::move(t));
  }
  return ts;
}

py::dict pick_mode(const py::list& trials) {
  const std::vector<run::Trial> ts = trials_from(trials);
  run::ModeDecision d;
  try {
    d = run::choose_mode(ts);
  } catch (const Error& e) {
    throw py::value_error(std::string("mode auto: ") + e.what());
  }
  py::dict out;
  out["mode"] = d.mode;
  out["reason"] = d.reason;
  return out;
}

}  // namespace tandem::python

void bind_trainer(py::module_& m) {
  m.def("choose_mode", &tandem::python::pick_mode, py::arg("trials"),
        "Mode auto's pick among measured trials ({mode, runs, error} each), by the run layer's "
        "rule: the simplest mode within the trials' noise of the fastest");
  m.def(
      "default_loader_workers",
      [](const std::string& device) {
        return tandem::run::default_loader_workers(c10::Device(device));
      },
      py::arg("device"),
      "Loader threads when none are given: the run layer's one rule (request.h), the CLI's too");
  m.def(
      "trial_order",
      [] {
        std::vector<std::string> names;
        for (const tandem::Mode mode : tandem::run::trial_order())
          names.push_back(tandem::to_string(mode));
        return names;
      },
      "The order mode auto times the modes in (the graphed ones first, pipelined+graphed first of "
      "all)");
  m.def(
      "needs_no_trial",
      [](const std::string& mode, const py::list& so_far, bool stages_to_overlap,
         double short_step_s) {
        return tandem::run::needs_no_trial(tandem::parse_mode(mode),
                                           tandem::python::trials_from(so_far), stages_to_overlap,
                                           short_step_s);
      },
      py::arg("mode"), py::arg("so_far"), py::arg("stages_to_overlap"),
      py::arg("short_step_s") = tandem::run::kShortStepSeconds,
      "Why a trial of `mode` could not change mode auto's pick given the trials so far "
      "({mode, runs, error} each), by the run layer's rule; '' when it could");
  m.def(
      "mode_by_device",
      [](const std::string& device) {
        const tandem::run::ModeResolution r =
            tandem::run::resolve_mode_by_device(std::nullopt, tandem::parse_device(device));
        py::dict out;
        out["mode"] = r.decision.mode;
        out["reason"] = r.decision.mode + " " + r.decision.reason;
        return out;
      },
      py::arg("device"),
      "Mode auto without trials ({mode, reason}), the run layer's rule by device (what `tandem "
      "train` runs): serial on the CPU, pipelined+graphed on a GPU");
  m.def(
      "mode_problem",
      [](const std::string& mode, bool run_folder, bool cuda, bool capturable,
         bool lr_schedule_on_host, const std::string& optimizer,
         const std::string& capturable_advice, const std::string& lr_advice) {
        tandem::run::ModeConstraints c;
        c.run_folder = run_folder;
        c.cuda = cuda;
        c.capturable = capturable;
        c.lr_schedule_on_host = lr_schedule_on_host;
        c.optimizer = optimizer;
        c.capturable_advice = capturable_advice;
        c.lr_advice = lr_advice;
        return tandem::run::mode_problem(tandem::parse_mode(mode), c);
      },
      py::arg("mode"), py::kw_only(), py::arg("run_folder"), py::arg("cuda"), py::arg("capturable"),
      py::arg("lr_schedule_on_host"), py::arg("optimizer"), py::arg("capturable_advice"),
      py::arg("lr_advice"),
      "Why `mode` cannot run a job with these constraints, '' when it can: the run layer's one "
      "rule (run::mode_problem), which `tandem train` asks too");
  m.def("run", &tandem::python::run, py::arg("config"),
        "Times a tandem.Trainer's steps through the run layer (benchmark()); returns the report "
        "(trainer.py)");
  m.def("data_seed", &tandem::python::data_seed, py::arg("seed"), py::arg("rank"),
        "The seed rank `rank` draws its data and augmentation from (WorkloadOptions::data_seed)");
  m.def("trials", &tandem::python::trials, py::arg("config"),
        "Times every mode on copies of a tandem.Trainer's modules; returns the trials and the "
        "pick");
}
