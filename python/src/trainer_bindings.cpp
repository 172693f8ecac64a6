// tandem._C's training entry points behind tandem.Trainer (tandem/trainer.py): a Workload made
// of the user's Python modules — feed stages (no grad), the model and loss function, a Python or
// tandem optimizer — run by tandem's runner in any mode through the run layer (run_workload: the
// CLI's timing, stage report, floor, trace and progress line; resolve_mode: mode auto's trials).
//
// Threads and the GIL: a run goes on a C++ thread of its own; the calling thread releases the
// GIL and only wakes every 100 ms to let Python handle signals (Ctrl-C cancels the run at its
// next step). The runner's lane threads take the GIL only inside a Python call (PythonCalls):
// eager steps call the user's modules there; a graphed stage calls them while it warms up and
// while it is captured, then replays its CUDA graph with no Python and no GIL at all.
#include <ATen/Context.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "augment_spec.h"
#include "job.h"
#include "py_dataset.h"
#include "python_calls.h"
#include "tandem/augment.h"
#include "tandem/run/data_parallel.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/run/run_workload.h"
#include "tandem/optim.h"
#include "tandem/workload.h"

namespace py = pybind11;

namespace tandem::python {
namespace {

/// A torch.optim optimizer (or any object with zero_grad(set_to_none=) and step()) as the train
/// stage's optimizer: both calls go to Python under the GIL. `capturable` is the Python side's
/// judgement (trainer.py: every param group says capturable=True, or torch.optim.SGD, whose
/// step keeps no host-side state but its constant learning rate).
class PythonOptimizer : public optim::Optimizer {
 public:
  PythonOptimizer(PyRef optimizer, std::string name, bool capturable,
                  std::vector<at::Tensor> params, std::shared_ptr<PythonCalls> calls)
      : optimizer_(std::move(optimizer)), name_(std::move(name)), capturable_(capturable),
        params_(std::move(params)), calls_(std::move(calls)) {}
  void zero_grad() override {
    calls_->call(name_ + ".zero_grad",
                 [&] { optimizer_->attr("zero_grad")(py::arg("set_to_none") = true); });
  }
  void step() override {
    calls_->call(name_ + ".step", [&] { optimizer_->attr("step")(); });
  }
  bool capturable() const override { return capturable_; }
  std::string name() const override { return name_; }
  std::vector<at::Tensor> parameters() const override { return params_; }

 private:
  PyRef optimizer_;
  std::string name_;
  bool capturable_;
  std::vector<at::Tensor> params_;
  std::shared_ptr<PythonCalls> calls_;
};

/// What tandem.Trainer hands over for a run (a dict from trainer.py, read under the GIL).
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
  bool lr_schedule = false;  // instance()'s 7th part applies one before each train step
  bool data_parallel = false;  // run as this process's rank of its job (job.h)
  run::RunRequest request;  // everything but the workload
};

at::Tensor tensor_result(const py::object& value, const std::string& who) {
  if (!THPVariable_Check(value.ptr()))
    throw py::type_error(who + " returned " +
                         std::string(py::str(py::type::of(value).attr("__name__"))) +
                         ": expected one torch.Tensor");
  return THPVariable_Unpack(value.ptr());
}

/// The loss as the runner records it: one float32 element that requires grad.
at::Tensor checked_loss(const py::object& value) {
  at::Tensor loss = tensor_result(value, "loss_fn");
  if (loss.numel() != 1)
    throw py::value_error("loss_fn returned a tensor of shape " + c10::str(loss.sizes()) +
                          ": expected one value (a mean or sum over the batch)");
  if (!loss.requires_grad())
    throw py::value_error(
        "loss_fn returned a loss that does not require grad: expected one computed from the "
        "model's output, with trainable parameters (is the model frozen, or the loss detached?)");
  return loss.scalar_type() == at::kFloat ? loss.reshape({}) : loss.reshape({}).to(at::kFloat);
}

/// The learning-rate setter of the instance a run built, for RunHooks::before_train_step
/// (the run's factory makes the instance, so it fills this in).
using LrApplier = std::shared_ptr<PyRef>;

Workload make_workload(const RunConfig& c, const WorkloadOptions& o,
                       const std::shared_ptr<PythonCalls>& calls, const LrApplier& apply_lr) {
  py::gil_scoped_acquire gil;
  const py::tuple parts = (*c.instance)(c.copy);
  if (c.lr_schedule) *apply_lr = hold(parts[6]);
  Workload w;
  w.name = c.name;
  w.device = o.device;
  w.data = c.dataset ? DataSource::from_dataset(c.dataset, c.shuffle, c.drop_last)
                     : DataSource::resident(c.resident);
  if (c.augment) {
    // Drawn from in step order, the same amount each step, so every mode draws what a plain
    // loop calling tandem.augment(x, spec, generator) draws: the Trainer's own generator, which
    // successive fits go on drawing from, or for copies (trials) a fresh one, seeded alike.
    const at::Generator generator = c.augment_generator
                                        ? *c.augment_generator
                                        : seeded_generator(o.device, o.data_seed());
    w.feeds.push_back(augment_feed(*c.augment, generator, c.input));
  }
  for (const py::handle item : py::list(parts[0])) {
    const auto pair = py::reinterpret_borrow<py::tuple>(item);
    const std::string name = pair[0].cast<std::string>();
    const PyRef fn = hold(py::reinterpret_borrow<py::object>(pair[1]));
    const std::string who = "feed '" + name + "'";
    w.feeds.push_back({name, name, {c.input}, {c.input},
                       [calls, fn, who](const Tensors& in) {
                         return calls->call(who, [&] {
                           return Tensors{tensor_result((*fn)(in[0]), who)};
                         });
                       },
                       "Python: " + std::string(py::repr(pair[1])).substr(0, 60)});
  }
  const PyRef model = hold(parts[1]), loss_fn = hold(parts[2]);
  const bool has_target = !c.target.empty();
  w.train.inputs = has_target ? std::vector<std::string>{c.input, c.target}
                              : std::vector<std::string>{c.input};
  w.train.loss = [calls, model, loss_fn, has_target](const Tensors& in) {
    return calls->call("the model or loss_fn", [&] {
      const py::object out = (*model)(in[0]);
      return checked_loss(has_target ? (*loss_fn)(out, in[1]) : (*loss_fn)(out));
    });
  };
  w.train.what = "Python: model, loss_fn";
  const py::object optimizer = parts[3];
  if (py::isinstance<optim::Optimizer>(optimizer)) {
    w.train.optimizer = optimizer.cast<std::shared_ptr<optim::Optimizer>>();
  } else {
    std::vector<at::Tensor> params;
    for (const py::handle group : optimizer.attr("param_groups"))
      for (const py::handle p : group["params"]) params.push_back(THPVariable_Unpack(p.ptr()));
    w.train.optimizer = std::make_shared<PythonOptimizer>(
        hold(optimizer), parts[5].cast<std::string>(), parts[4].cast<bool>(), std::move(params),
        calls);
  }
  return w;
}

RunConfig read_config(const py::dict& d) {
  RunConfig c;
  c.name = d["name"].cast<std::string>();
  c.instance = hold(d["instance"]);
  c.copy = d["copy"].cast<bool>();
  const py::object data = d["data"];
  if (py::isinstance<py::list>(data)) {
    for (const py::handle b : data) {
      Batch batch;
      for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(b))
        batch.set(k.cast<std::string>(), THPVariable_Unpack(v.ptr()));
      c.resident.push_back(std::move(batch));
    }
  } else {
    c.dataset = data.cast<const PyDataset&>().dataset;
  }
  c.input = d["input"].cast<std::string>();
  c.target = d["target"].is_none() ? "" : d["target"].cast<std::string>();
  c.lr_schedule = d["lr_schedule"].cast<bool>();
  if (!d["augment"].is_none()) {
    const py::dict a = d["augment"];
    c.augment = augment_spec_from(
        a["crop"].cast<std::vector<int64_t>>(), a["out"].cast<std::vector<int64_t>>(),
        a["max_rotation_deg"].cast<double>(), a["blur_kernel"].cast<int64_t>(),
        a["sigma_min"].cast<double>(), a["sigma_max"].cast<double>(),
        a["mean"].cast<std::vector<double>>(), a["std"].cast<std::vector<double>>(),
        a["hflip_probability"].cast<double>());
    if (!d["augment_generator"].is_none())
      c.augment_generator = d["augment_generator"].cast<at::Generator>();
  }
  run::RunRequest& b = c.request;
  b.device = d["device"].cast<std::string>();
  b.mode = run::parse_run_mode(d["mode"].cast<std::string>());
  if (!d["batch_size"].is_none()) b.batch_size = d["batch_size"].cast<int64_t>();
  b.steps = d["steps"].cast<int64_t>();
  b.warmup = d["warmup"].cast<int64_t>();
  b.workers = d["workers"].cast<int>();
  b.seed = d["seed"].cast<uint64_t>();
  b.skip_bad = d["skip_bad"].cast<bool>();
  b.first_step = d["first_step"].cast<int64_t>();
  b.trace_path = d["trace"].is_none() ? "" : d["trace"].cast<std::string>();
  b.progress = d["progress"].cast<bool>();
  b.cudnn_benchmark = d["cudnn_benchmark"].cast<bool>();
  b.gpu_monitor = d["gpu_monitor"].cast<bool>();
  c.shuffle = d["shuffle"].cast<bool>();
  c.drop_last = d["drop_last"].cast<bool>();
  c.data_parallel = d["data_parallel"].cast<bool>();
  for (const auto& [mode, why] : d["ruled_out"].cast<py::dict>())
    b.ruled_out[parse_mode(mode.cast<std::string>())] = why.cast<std::string>();
  return c;
}

/// Runs `f` on a thread of its own while this thread, the GIL released, lets Python handle
/// signals every 100 ms: a KeyboardInterrupt (or any exception a handler raises) sets `cancel`,
/// which stops the run at its next step, and is what the caller raises afterwards.
template <typename R, typename F>
R run_interruptible(F f, std::atomic<bool>& cancel, PythonCalls& calls) {
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
      if (cancel) continue;
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          interrupt.emplace();  // fetches the handler's exception
          cancel = true;
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

WorkloadEntry entry_for(const RunConfig& c, const std::shared_ptr<PythonCalls>& calls,
                        const LrApplier& apply_lr) {
  WorkloadEntry e;
  e.name = c.name;
  e.description = "a tandem.Trainer's modules";
  e.gpu_batch_size = e.cpu_batch_size = 1;  // resident data: the batches' own size counts
  e.make = [c, calls, apply_lr](const WorkloadOptions& o) {
    return make_workload(c, o, calls, apply_lr);
  };
  return e;
}

py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

/// The previous cuDNN benchmark switch, put back when a run ends (a run sets its own).
struct KeepCudnnBenchmark {
  bool previous = at::globalContext().benchmarkCuDNN();
  ~KeepCudnnBenchmark() { at::globalContext().setBenchmarkCuDNN(previous); }
};

/// One run of a tandem.Trainer's config: a request whose workload is the Trainer's modules, its
/// hooks, and the run's Python calls and cancel flag, which outlive the request's copies.
struct PreparedRun {
  std::shared_ptr<PythonCalls> calls = std::make_shared<PythonCalls>();
  std::atomic<bool> cancel{false};
  run::RunRequest request;
  run::RunHooks hooks;
  std::shared_ptr<distributed::ProcessGroup> job;  // data parallel: this process's job
  explicit PreparedRun(const py::dict& config) {
    RunConfig c = read_config(config);
    if (c.data_parallel) {
      job = current_job();
      TANDEM_CHECK_ARG(job != nullptr, "a data-parallel run before its process joined the job "
                                       "(tandem.distributed joins it first)");
      run::apply_data_parallel(c.request, hooks, job);
    }
    const auto apply_lr = std::make_shared<PyRef>();
    c.request.workload = entry_for(c, calls, apply_lr);
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
    return run_interruptible<R>(f, cancel, *calls);
  }
};

}  // namespace

py::dict run(const py::dict& config) {
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
    out["table"] =
        run::describe_data_parallel(block) + "\n\n" + out["table"].cast<std::string>();
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

py::dict trials(const py::dict& config) {
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

}  // namespace tandem::python

void bind_trainer(py::module_& m) {
  m.def("run", &tandem::python::run, py::arg("config"),
        "Runs a tandem.Trainer's steps through the runner; returns the report (trainer.py)");
  m.def("data_seed", &tandem::python::data_seed, py::arg("seed"), py::arg("rank"),
        "The seed rank `rank` draws its data and augmentation from (WorkloadOptions::data_seed)");
  m.def("trials", &tandem::python::trials, py::arg("config"),
        "Times every mode on copies of a tandem.Trainer's modules; returns the trials and the "
        "pick");
}
