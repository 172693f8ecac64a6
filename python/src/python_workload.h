// A tandem.Trainer's run as C++ sees it (trainer.py fills a typed RunConfig): the config, the
// Workload made of the user's Python modules, and the thread that runs it while Python goes on
// handling signals. Shared by the run layer's entry points (trainer_bindings.cpp:
// fit without a run folder, benchmark, mode auto's trials) and the training loop's
// (train_bindings.cpp: fit with a run folder).
#pragma once

#include <ATen/Context.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "augment_spec.h"
#include "python_calls.h"
#include "tandem/run/request.h"
#include "tandem/workload.h"

namespace tandem::python {

namespace py = pybind11;

/// What tandem.Trainer hands over for a run (tandem._C.RunConfig, filled by trainer.py).
struct RunConfig {
  /// instance(copy) -> (feeds [(name, callable)], model, loss_fn, optimizer, capturable,
  /// optimizer name, apply_lr(step) or None): the user's objects, or deep copies of them
  /// (trials, benchmarks).
  std::string name;  // the model's, for reports
  PyRef instance;
  bool copy = false;
  std::shared_ptr<const Dataset> dataset;  // or resident batches
  bool shuffle = false, drop_last = true;  // a dataset's
  std::vector<Batch> resident;
  std::string input, target;  // target empty: loss_fn(output)
  std::optional<AugmentSpec> augment;
  std::optional<at::Generator> augment_generator;  // the Trainer's; none: a fresh one per run
  bool lr_schedule = false;    // instance()'s 7th part applies one before each train step
  bool data_parallel = false;  // run as this process's rank of its job (job.h)
  run::RunRequest request;     // everything but the workload
};

/// The config's request as the run layer resolves it (run::resolve, every default filled and
/// every value checked), for the Trainer's modules.
run::RunRequest resolved_request(const RunConfig& c);

/// Binds RunConfig and run::RunRequest as tandem._C.RunConfig and tandem._C.RunRequest.
void bind_run_config(py::module_& m);

/// The learning-rate setter of the instance a run built, for RunHooks::before_train_step
/// (the run's factory makes the instance, so it fills this in).
using LrApplier = std::shared_ptr<PyRef>;

/// The Workload of a run: the augmentation (when asked), each feed stage, the model and
/// loss_fn as the train stage, the Python or tandem optimizer. Takes the GIL.
Workload make_workload(const RunConfig& c, const WorkloadOptions& o,
                       const std::shared_ptr<PythonCalls>& calls, const LrApplier& apply_lr);

/// The run layer's entry for the Trainer's modules: its factory makes a Workload of them
/// (make_workload) with `calls` and `apply_lr`.
WorkloadEntry workload_entry(const RunConfig& c, const std::shared_ptr<PythonCalls>& calls,
                             const LrApplier& apply_lr);

/// A function of tandem/_state.py, which knows torch.optim's param groups and the state_dicts
/// (call with the GIL).
py::object state_py(const char* name);

/// `j` as Python objects (dicts, lists, numbers, strings).
py::object to_python(const nlohmann::json& j);

/// The previous cuDNN benchmark switch, put back when a run ends (a run sets its own).
struct KeepCudnnBenchmark {
  bool previous = at::globalContext().benchmarkCuDNN();
  ~KeepCudnnBenchmark() { at::globalContext().setBenchmarkCuDNN(previous); }
};

/// Runs `f` on a thread of its own while this thread, the GIL released, lets Python handle
/// signals every 100 ms: a KeyboardInterrupt (or any exception a handler raises) calls
/// `interrupt` (once), which stops the run at its next step, and is what the caller raises
/// afterwards.
template <typename R, typename F>
R run_interruptible(F f, const std::function<void()>& interrupt_run, PythonCalls& calls) {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::optional<R> result;
  std::exception_ptr failure;
  std::thread worker([&] {
    try {
      result.emplace(f());
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    cv.notify_all();
  });
  std::optional<py::error_already_set> interrupt;
  {
    py::gil_scoped_release no_gil;
    std::unique_lock<std::mutex> lock(mutex);
    while (!cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; })) {
      if (interrupt) continue;
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          interrupt.emplace();  // fetches the handler's exception
          interrupt_run();
        }
      }
      lock.lock();
    }
  }
  worker.join();
  if (interrupt) throw *interrupt;
  if (failure) {
    if (std::optional<py::error_already_set> e = calls.take()) {
      // The user's own exception, with its traceback; the runner's context as a note.
      std::string where;
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& x) {
        where = x.what();
      }
      const py::object value = e->value();
      if (py::hasattr(value, "add_note"))
        value.attr("add_note")("tandem: " + where.substr(0, where.find('\n')));
      throw *e;
    }
    std::rethrow_exception(failure);
  }
  return std::move(*result);
}

}  // namespace tandem::python
