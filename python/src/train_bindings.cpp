// tandem._C's training loop behind tandem.Trainer.fit (tandem/trainer.py): the Trainer's Python
// modules as a train::TrainJob, run by train::Trainer — the loop `tandem train` runs. With a run
// folder (Trainer(out=...)) a fit gets its epochs, evaluation, metrics.jsonl/.csv, atomic
// checkpoints, exact resume and a stop that keeps a checkpoint, as the CLI's does; without one,
// its steps back to back, reported as the run layer reports a run (rate, stages, floor, GPU
// utilization, trace). benchmark() and mode auto's trials time copies on the run layer
// (trainer_bindings.cpp).
//
// The Python parts: the model's weights are its state_dict (ModelWeights), the optimizer's
// state its state_dict (python_workload.cpp's PythonOptimizer), the evaluation and the
// learning-rate schedule are Python calls made on the train lane between steps. Ctrl-C asks
// the loop to stop: the step in flight finishes, a folder's run writes a checkpoint, and fit
// raises KeyboardInterrupt (naming the checkpoint).
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
#include "tandem/detail/trace.h"
#include "tandem/run/data_parallel.h"
#include "tandem/run/gpu_monitor.h"
#include "tandem/run/progress.h"
#include "tandem/run/report.h"
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
      return state_py("_model_state")(*model).cast<models::NamedTensors>();
    });
  };
  w.load_state_dict = [model, calls](const models::NamedTensors& tensors) {
    calls->call("model.load_state_dict", [&] { state_py("_load_model_state")(*model, tensors); });
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
  out["first_epoch_images_per_s"] = report.first_epoch_images_per_s;
  out["first_eval_images_per_s"] = report.first_eval_images_per_s;
  out["table"] = report.text;
  out["setup"] = to_python(train::to_json(r.setup));
  return out;
}

}  // namespace

/// A fit without a run folder, reported as the run layer reports a run (run_workload): its
/// rate over the whole fit, each stage's time and the floor, GPU utilization, the notes.
run::RunReport run_report(const RunConfig& c, const train::TrainResult& r,
                          const run::GpuMonitor& monitor) {
  run::RunReport report;
  report.request = c.request;  // resolved (FitSession::fit): the entry's name, the device's
  const c10::Device device = parse_device(report.request.device);
  report.losses = r.losses;
  report.timing = r.timing;
  report.notes = r.notes;
  report.skipped = r.skipped;
  run::set_measurements(report, device, static_cast<int64_t>(r.losses.size()), r.seconds, monitor);
  return report;
}

/// What a fit's training loop takes beyond its run (tandem._C.LoopConfig, filled by trainer.py).
struct LoopConfig {
  PyRef model;                // the module whose state_dict a run folder saves
  PyRef evaluate;             // evaluate() -> metrics, or none
  std::string config = "{}";  // what a resume must match, as JSON (trainer.py's _run_config)
  int64_t steps = 0, epochs = 0;
  std::optional<std::string> out;  // the run folder, or none
  bool resume = false;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 0;
  PyRef lr_schedule;  // step -> lr, or none
};

/// The Trainer's modules as the loop's job (the weights' state_dict only for a run folder).
train::TrainJob python_job(const RunConfig& c, const LoopConfig& t, bool folder,
                           const std::shared_ptr<PythonCalls>& calls) {
  train::TrainJob job;
  job.name = c.name;
  job.workload =
      make_workload(c, run::workload_options(c.request), calls, std::make_shared<PyRef>());
  if (folder) job.weights = python_weights(t.model, calls);
  if (t.evaluate) job.evaluate = python_evaluation(t.evaluate, calls);
  job.config = nlohmann::json::parse(t.config);
  return job;
}

/// The loop's options from trainer.py's configs; the stop flag, the group, the trace and the
/// progress callbacks are the caller's.
train::TrainOptions loop_options(const RunConfig& c, const LoopConfig& t, bool folder,
                                 const std::shared_ptr<PythonCalls>& calls) {
  train::TrainOptions to;
  to.epochs = t.epochs;
  to.steps = t.steps;
  if (!folder) to.first_step = c.request.first_step;  // a folder's run: its checkpoint's
  to.batch_size = c.request.batch_size.value();       // trainer.py gives these three
  to.workers = c.request.workers.value();
  to.mode = *c.request.mode;
  to.seed = c.request.seed;
  to.skip_bad = c.request.skip_bad;
  if (folder) to.out_dir = *t.out;
  to.resume = t.resume;
  to.checkpoint_every = t.checkpoint_every;
  to.keep_checkpoints = t.keep_checkpoints;
  if (!folder) to.device_timing_every = c.request.device_timing_every;  // as the run layer's
  if (t.lr_schedule) {
    const PyRef schedule = t.lr_schedule;
    to.schedule = [schedule, calls](int64_t step) {
      return calls->call("lr_schedule",
                         [&] { return py::float_((*schedule)(step)).cast<double>(); });
    };
  }
  return to;
}

/// A folder-less fit's report as Python gets it (the data-parallel block reduced over the
/// ranks when there are several).
py::dict report_to_python(run::RunReport& r, distributed::ProcessGroup* group) {
  nlohmann::json block;
  if (group) {
    py::gil_scoped_release no_gil;  // waits for the other ranks' runs to end
    block = run::reduce_over_ranks(r, *group);
  }
  py::dict out = to_python(run::to_json(r));
  out["losses"] = r.losses;
  out["table"] = run::describe_report(r);
  if (group) {
    out["data_parallel"] = to_python(block);
    out["table"] = run::describe_data_parallel(block) + "\n\n" + out["table"].cast<std::string>();
  }
  return out;
}

/// A tandem.Trainer's fits, each through the training loop. Fits without a run folder go one
/// after another on one train::Trainer, whose Runner keeps its lanes' threads and the CUDA graphs
/// the first fit captured (train::Trainer::set_next_run): a later fit replays from its first
/// step. trainer.py keeps a session per Trainer while what it was built from is unchanged, and
/// makes a new one otherwise; a fit that fails leaves nothing kept. A run folder's fit is a
/// session of its own.
class FitSession {
 public:
  py::dict fit(const RunConfig& config, const LoopConfig& loop);

 private:
  std::shared_ptr<PythonCalls> calls_ = std::make_shared<PythonCalls>();
  std::unique_ptr<train::Trainer> trainer_;  // kept between fits without a run folder
  std::atomic<int> stop_{0};
  c10::Device device_{c10::kCPU};  // the job's
};

py::dict FitSession::fit(const RunConfig& config, const LoopConfig& t) {
  RunConfig c = config;
  c.request = resolved_request(c);  // the defaults trainer.py leaves to the run layer
  const bool folder = t.out.has_value();
  TANDEM_CHECK_ARG(!folder || !trainer_,
                   "a run folder's fit is a session of its own: expected a new session");
  std::shared_ptr<distributed::ProcessGroup> group;
  if (c.data_parallel) {
    group = current_job();
    TANDEM_CHECK_ARG(group != nullptr,
                     "a data-parallel run before its process joined the job "
                     "(tandem.distributed joins it first)");
    run::RunHooks unused;  // the Trainer makes the workload data parallel itself
    run::apply_data_parallel(c.request, unused, group);
  }
  TANDEM_CHECK_ARG(c.request.mode.has_value(), "fit needs a resolved mode");
  const bool lead = c.request.rank == 0;

  std::optional<train::TrainJob> job;  // the first fit's; later ones run the kept Trainer's
  if (!trainer_) {
    job = python_job(c, t, folder, calls_);
    device_ = job->workload.device;
  }
  stop_ = 0;
  train::TrainOptions to = loop_options(c, t, folder, calls_);
  to.stop = &stop_;
  to.group = group;
  std::unique_ptr<Trace> trace;
  if (!folder && !c.request.trace_path.empty())
    to.trace = (trace = std::make_unique<Trace>()).get();
  const bool show = c.request.progress && lead;
  const bool tty = show && ::isatty(STDERR_FILENO);
  const auto started = std::chrono::steady_clock::now();
  // A folder's run: its epoch bar and a line per epoch; one without: the run layer's line.
  run::Progress steps_line(c.name + " " + run::mode_name(c.request.mode), to.steps, !folder && tty);
  // The callbacks read this fit's locals: the next fit's set_next_run replaces them.
  if (tty)
    to.on_progress = [&, first = to.first_step](const train::TrainOptions::Progress& p) {
      if (!folder) return steps_line.update(p.step - first);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::fprintf(stderr, "\r\033[K%s", train::progress_line(p, to.batch_size, elapsed).c_str());
      std::fflush(stderr);
    };
  to.on_epoch = [&, epochs = to.epochs](const train::EpochRecord& r) {
    if (!show) return;
    std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", train::epoch_line(r, epochs).c_str());
    std::fflush(stderr);
  };

  const KeepCudnnBenchmark keep;
  at::globalContext().setBenchmarkCuDNN(c.request.cudnn_benchmark.value());
  std::optional<run::GpuMonitor> monitor;  // a folder-less fit reports GPU utilization
  if (!folder) monitor.emplace(device_);
  std::optional<train::TrainResult> result;
  int64_t steps_per_epoch = 0;
  try {
    run_interruptible<bool>(
        [&] {
          try {
            if (trainer_)
              trainer_->set_next_run(std::move(to));
            else
              trainer_ = std::make_unique<train::Trainer>(std::move(*job), std::move(to));
            steps_per_epoch = trainer_->steps_per_epoch();
            if (show && trainer_->resumed()) {
              std::fprintf(stderr, "%s\n",
                           train::resume_line(trainer_->start_step(), steps_per_epoch).c_str());
              std::fflush(stderr);
            }
            if (monitor && c.request.gpu_monitor) monitor->start();
            result = trainer_->run();
            if (monitor) monitor->stop();
          } catch (...) {
            if (monitor) monitor->stop();
            trainer_.reset();          // nothing kept from a fit that failed
            if (group) abandon_job();  // as run() does: the other ranks see this one stop
            throw;
          }
          return true;
        },
        [&] { stop_ = SIGINT; }, *calls_);
  } catch (py::error_already_set& e) {
    // A Ctrl-C: the loop stopped at a step (a folder's run kept a checkpoint): say where.
    if (folder && result && result->stopped_by_signal != 0 &&
        (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) &&
        py::hasattr(e.value(), "add_note"))
      e.value().attr("add_note")("tandem: stopped after step " + std::to_string(result->steps) +
                                 "; checkpoint " + result->last_checkpoint +
                                 ". fit(..., resume=True) continues the run");
    trainer_.reset();  // a stopped fit: the next one starts afresh, as its steps_done says
    throw;
  }
  steps_line.finish();
  if (tty && folder) std::fprintf(stderr, "\r\033[K");
  if (folder) {
    trainer_.reset();
    const train::EpochsReport report = train::describe_epochs(*result, steps_per_epoch);
    return result_to_python(*result, report, steps_per_epoch);
  }
  run::RunReport r = run_report(c, *result, *monitor);
  if (trace) trace->write(c.request.trace_path);  // throws if the file cannot be written
  py::dict out = report_to_python(r, group.get());
  out["setup"] = to_python(train::to_json(result->setup));
  return out;
}

py::dict train_run(const RunConfig& config, const LoopConfig& loop) {
  return FitSession().fit(config, loop);
}

}  // namespace tandem::python

void bind_train(py::module_& m) {
  using tandem::python::held_or_none;
  using tandem::python::hold_unless_none;
  using tandem::python::LoopConfig;
  py::class_<LoopConfig>(m, "LoopConfig",
                         "What a tandem.Trainer's fit hands the training loop beside its "
                         "RunConfig: the steps or epochs, the run folder, checkpoints, the "
                         "evaluation and the lr schedule (trainer.py fills it)")
      .def(py::init<>())
      .def_property(
          "model", [](const LoopConfig& l) { return held_or_none(l.model); },
          [](LoopConfig& l, const py::object& o) { l.model = hold_unless_none(o); })
      .def_property(
          "evaluate", [](const LoopConfig& l) { return held_or_none(l.evaluate); },
          [](LoopConfig& l, const py::object& o) { l.evaluate = hold_unless_none(o); })
      .def_readwrite("config", &LoopConfig::config)
      .def_readwrite("steps", &LoopConfig::steps)
      .def_readwrite("epochs", &LoopConfig::epochs)
      .def_readwrite("out", &LoopConfig::out)
      .def_readwrite("resume", &LoopConfig::resume)
      .def_readwrite("checkpoint_every", &LoopConfig::checkpoint_every)
      .def_readwrite("keep_checkpoints", &LoopConfig::keep_checkpoints)
      .def_property(
          "lr_schedule", [](const LoopConfig& l) { return held_or_none(l.lr_schedule); },
          [](LoopConfig& l, const py::object& o) { l.lr_schedule = hold_unless_none(o); });
  py::class_<tandem::python::FitSession>(
      m, "FitSession",
      "A tandem.Trainer's fits on one training loop: fits without a run folder keep its lanes' "
      "threads and CUDA graphs for the next (trainer.py)")
      .def(py::init<>())
      .def("fit", &tandem::python::FitSession::fit, py::arg("config"), py::arg("loop"),
           "Runs one fit as train() does, on this session's kept training loop");
  m.def("train", &tandem::python::train_run, py::arg("config"), py::arg("loop"),
        "Runs a tandem.Trainer's fit through the training loop (train::Trainer): into a run "
        "folder, returning the epochs, the losses and where the checkpoints are; without one, "
        "returning the run's report (trainer.py)");
}
