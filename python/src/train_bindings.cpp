// tandem._C's training loop behind tandem.Trainer(out=...).fit (tandem/trainer.py): the
// Trainer's Python modules as a train::TrainJob, run by train::Trainer — the loop `tandem train`
// runs — so a Python run gets its epochs, evaluation, metrics.jsonl/.csv, atomic checkpoints,
// exact resume and a stop that keeps a checkpoint, as the CLI's does.
//
// The Python parts: the model's weights are its state_dict (ModelWeights), the optimizer's
// state its state_dict (python_workload.cpp's PythonOptimizer), the evaluation and the
// learning-rate schedule are Python calls made on the train lane between steps. Ctrl-C asks
// the loop to stop: the step in flight finishes, a checkpoint is written, and fit raises
// KeyboardInterrupt naming it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "job.h"
#include "python_workload.h"
#include "tandem/run/data_parallel.h"
#include "tandem/train/report.h"
#include "tandem/train/trainer.h"

namespace py = pybind11;

namespace tandem::python {
namespace {

/// The Python model's weights through its state_dict: every entry a tensor (a module's extra
/// state, which is not one, is refused by the Python side).
train::ModelWeights python_weights(const PyRef& model, const std::shared_ptr<PythonCalls>& calls) {
  train::ModelWeights w;
  w.state_dict = [model, calls] {
    return calls->call("model.state_dict", [&] {
      return trainer_py("_model_state")(*model).cast<models::NamedTensors>();
    });
  };
  w.load_state_dict = [model, calls](const models::NamedTensors& tensors) {
    calls->call("model.load_state_dict", [&] { trainer_py("_load_model_state")(*model, tensors); });
  };
  return w;
}

/// The user's evaluation (trainer.py wraps it: eval mode, no grad, its result checked) as the
/// job's: (metrics {name: float}, samples scored).
std::function<train::Evaluation(const Lane&)> python_evaluation(
    const PyRef& evaluate, const std::shared_ptr<PythonCalls>& calls) {
  return [evaluate, calls](const Lane&) {
    return calls->call("evaluate", [&] {
      const py::tuple r = (*evaluate)();
      return train::Evaluation(r[0].cast<train::Metrics>(), r[1].cast<int64_t>());
    });
  };
}

py::dict result_to_python(const train::TrainResult& r, const train::EpochsReport& report,
                          int64_t steps_per_epoch) {
  py::dict out;
  py::list epochs;
  for (const auto& e : r.epochs) epochs.append(to_python(train::to_json(e)));
  out["epochs"] = epochs;
  out["steps"] = r.steps;
  out["steps_per_epoch"] = steps_per_epoch;
  out["losses"] = r.losses;
  out["stopped_by_signal"] = r.stopped_by_signal;
  out["last_checkpoint"] = r.last_checkpoint;
  out["weights"] = r.weights;
  out["notes"] = r.notes;
  out["resumed_from"] = r.resumed_from;
  py::list skipped;
  for (const auto& s : r.skipped) skipped.append(py::make_tuple(s.index, s.reason));
  out["skipped"] = skipped;
  out["images_per_s"] = report.images_per_s.value;
  out["eval_images_per_s"] = report.eval_images_per_s.value;
  out["table"] = report.text;
  return out;
}

}  // namespace

py::dict train_run(const py::dict& config) {
  RunConfig c = read_config(config);
  const py::dict t = config["train"];
  auto calls = std::make_shared<PythonCalls>();
  std::shared_ptr<distributed::ProcessGroup> group;
  if (c.data_parallel) {
    group = current_job();
    TANDEM_CHECK_ARG(group != nullptr,
                     "a data-parallel run before its process joined the job "
                     "(tandem.distributed joins it first)");
    run::RunHooks unused;  // the Trainer makes the workload data parallel itself
    run::apply_data_parallel(c.request, unused, group);
  }
  TANDEM_CHECK_ARG(c.request.mode.has_value(), "fit with a run folder needs a resolved mode");
  const bool lead = c.request.rank == 0;

  train::TrainJob job;
  job.name = c.name;
  job.workload =
      make_workload(c, run::workload_options(c.request), calls, std::make_shared<PyRef>());
  job.weights = python_weights(hold(t["model"]), calls);
  if (!t["evaluate"].is_none()) job.evaluate = python_evaluation(hold(t["evaluate"]), calls);
  job.config = nlohmann::json::parse(t["config"].cast<std::string>());

  std::atomic<int> stop{0};
  train::TrainOptions to;
  to.epochs = t["epochs"].cast<int64_t>();
  to.batch_size = c.request.batch_size.value();  // trainer.py gives these three
  to.workers = c.request.workers.value();
  to.mode = *c.request.mode;
  to.seed = c.request.seed;
  to.skip_bad = c.request.skip_bad;
  to.out_dir = t["out"].cast<std::string>();
  to.resume = t["resume"].cast<bool>();
  to.checkpoint_every = t["checkpoint_every"].cast<int64_t>();
  to.keep_checkpoints = t["keep_checkpoints"].cast<int>();
  to.stop = &stop;
  to.group = group;
  if (!t["lr_schedule"].is_none()) {
    const PyRef schedule = hold(t["lr_schedule"]);
    to.schedule = [schedule, calls](int64_t step) {
      return calls->call("lr_schedule",
                         [&] { return py::float_((*schedule)(step)).cast<double>(); });
    };
  }
  const bool show = c.request.progress && lead;
  const bool tty = show && ::isatty(STDERR_FILENO);
  const auto started = std::chrono::steady_clock::now();
  to.on_progress = [&](const train::TrainOptions::Progress& p) {
    if (!tty) return;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "\r\033[K%s", train::progress_line(p, to.batch_size, elapsed).c_str());
    std::fflush(stderr);
  };
  to.on_epoch = [&](const train::EpochRecord& r) {
    if (!show) return;
    std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", train::epoch_line(r, to.epochs).c_str());
    std::fflush(stderr);
  };

  const KeepCudnnBenchmark keep;
  at::globalContext().setBenchmarkCuDNN(c.request.cudnn_benchmark.value());
  std::optional<train::TrainResult> result;
  int64_t steps_per_epoch = 0;
  try {
    run_interruptible<bool>(
        [&] {
          try {
            train::Trainer trainer(job, to);
            steps_per_epoch = trainer.steps_per_epoch();
            result = trainer.run();
          } catch (...) {
            if (group) abandon_job();  // as run() does: the other ranks see this one stop
            throw;
          }
          return true;
        },
        [&] { stop = SIGINT; }, *calls);
  } catch (py::error_already_set& e) {
    // A Ctrl-C: the loop stopped at a step and kept a checkpoint; say where, then raise it.
    if (result && result->stopped_by_signal != 0 && e.matches(PyExc_KeyboardInterrupt) &&
        py::hasattr(e.value(), "add_note"))
      e.value().attr("add_note")("tandem: stopped after step " + std::to_string(result->steps) +
                                 "; checkpoint " + result->last_checkpoint +
                                 ". fit(..., resume=True) continues the run");
    throw;
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  const train::EpochsReport report = train::describe_epochs(*result, steps_per_epoch);
  return result_to_python(*result, report, steps_per_epoch);
}

}  // namespace tandem::python

void bind_train(py::module_& m) {
  m.def("train", &tandem::python::train_run, py::arg("config"),
        "Runs a tandem.Trainer's epochs through the training loop (train::Trainer) into a run "
        "folder; returns the epochs, the losses and where the checkpoints are (trainer.py)");
}
