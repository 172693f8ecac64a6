// A tandem.Trainer's run as C++ sees it (python_workload.h).
#include "python_workload.h"

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "py_dataset.h"
#include "tandem/augment.h"
#include "tandem/optim.h"

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
      : optimizer_(std::move(optimizer)),
        name_(std::move(name)),
        capturable_(capturable),
        params_(std::move(params)),
        calls_(std::move(calls)) {}
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
  // The learning rate and the checkpoints' state through tandem/_state.py's helpers, which
  // know torch.optim's param groups and state_dict.
  void set_lr(double lr) override {
    calls_->call(name_ + " learning rate", [&] { state_py("_set_lr")(*optimizer_, lr); });
  }
  double learning_rate() const override {
    return calls_->call(name_ + " learning rate",
                        [&] { return state_py("_lr_of")(*optimizer_).cast<double>(); });
  }
  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    return calls_->call(name_ + ".state_dict", [&] {
      return state_py("_optimizer_state")(*optimizer_)
          .cast<std::vector<std::pair<std::string, at::Tensor>>>();
    });
  }
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    calls_->call(name_ + ".load_state_dict",
                 [&] { state_py("_load_optimizer_state")(*optimizer_, state); });
  }

 private:
  PyRef optimizer_;
  std::string name_;
  bool capturable_;
  std::vector<at::Tensor> params_;
  std::shared_ptr<PythonCalls> calls_;
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

}  // namespace

py::object state_py(const char* name) { return py::module_::import("tandem._state").attr(name); }

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
    const at::Generator generator =
        c.augment_generator ? *c.augment_generator : seeded_generator(o.device, o.data_seed());
    w.feeds.push_back(augment_feed(*c.augment, generator, c.input));
  }
  for (const py::handle item : py::list(parts[0])) {
    const auto pair = py::reinterpret_borrow<py::tuple>(item);
    const std::string name = pair[0].cast<std::string>();
    const PyRef fn = hold(py::reinterpret_borrow<py::object>(pair[1]));
    const std::string who = "feed '" + name + "'";
    w.feeds.push_back({name,
                       name,
                       {c.input},
                       {c.input},
                       [calls, fn, who](const Tensors& in) {
                         return calls->call(
                             who, [&] { return Tensors{tensor_result((*fn)(in[0]), who)}; });
                       },
                       "Python: " + std::string(py::repr(pair[1])).substr(0, 60)});
  }
  const PyRef model = hold(parts[1]), loss_fn = hold(parts[2]);
  const bool has_target = !c.target.empty();
  w.train.inputs =
      has_target ? std::vector<std::string>{c.input, c.target} : std::vector<std::string>{c.input};
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
    w.train.optimizer =
        std::make_shared<PythonOptimizer>(hold(optimizer), parts[5].cast<std::string>(),
                                          parts[4].cast<bool>(), std::move(params), calls);
  }
  return w;
}

namespace {

// Setters of RunConfig's fields that Python hands over as Python objects.
void set_data(RunConfig& c, const py::object& data) {
  c.resident.clear();
  c.dataset.reset();
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
}

// What set_data took, back: the batches (dicts of the same tensors), the dataset, or None.
py::object data_of(const RunConfig& c) {
  if (c.dataset) return py::cast(PyDataset{c.dataset});
  if (c.resident.empty()) return py::none();
  py::list out;
  for (const Batch& b : c.resident) {
    py::dict batch;
    for (const auto& [name, tensor] : b.tensors())
      batch[py::str(name)] = py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
    out.append(batch);
  }
  return out;
}

void set_augment(RunConfig& c, const py::object& spec) {
  if (spec.is_none()) {
    c.augment.reset();
    return;
  }
  const py::dict a = spec;
  c.augment = augment_spec_from(
      a["crop"].cast<std::vector<int64_t>>(), a["out"].cast<std::vector<int64_t>>(),
      a["max_rotation_deg"].cast<double>(), a["blur_kernel"].cast<int64_t>(),
      a["sigma_min"].cast<double>(), a["sigma_max"].cast<double>(),
      a["mean"].cast<std::vector<double>>(), a["std"].cast<std::vector<double>>(),
      a["hflip_probability"].cast<double>());
}

py::dict ruled_out_of(const run::RunRequest& r) {
  py::dict out;
  for (const auto& [mode, why] : r.ruled_out) out[py::str(to_string(mode))] = why;
  return out;
}

void set_ruled_out(run::RunRequest& r, const py::dict& ruled_out) {
  r.ruled_out.clear();
  for (const auto& [mode, why] : ruled_out)
    r.ruled_out[parse_mode(mode.cast<std::string>())] = why.cast<std::string>();
}

}  // namespace

WorkloadEntry workload_entry(const RunConfig& c, const std::shared_ptr<PythonCalls>& calls,
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

run::RunRequest resolved_request(const RunConfig& c) {
  run::RunRequest r = c.request;
  // The run layer's one resolve() over the Trainer's entry (resolve builds nothing; it takes
  // the batch size from the request, which trainer.py always sets).
  r.workload = workload_entry(c, std::make_shared<PythonCalls>(), std::make_shared<PyRef>());
  return run::resolve(std::move(r));
}

void bind_run_config(py::module_& m) {
  using run::RunRequest;
  py::class_<RunRequest>(
      m, "RunRequest",
      "One run's settings as the run layer takes them (run/include/tandem/run/request.h), the "
      "same type `tandem bench`, `tandem train` and `tandem data-bench` fill. None: the run "
      "layer's default, filled by RunConfig.resolved_request()")
      .def(py::init<>())
      .def_property(
          "mode", [](const RunRequest& r) { return run::mode_name(r.mode); },
          [](RunRequest& r, const std::string& mode) { r.mode = run::parse_run_mode(mode); },
          "a mode's name, or 'auto'")
      .def_property("ruled_out", &ruled_out_of, &set_ruled_out,
                    "{mode: why} for the modes this run cannot take (mode auto leaves them out)")
      .def_readwrite("stages_to_overlap", &RunRequest::stages_to_overlap)
      .def_readwrite("device", &RunRequest::device)
      .def_readwrite("batch_size", &RunRequest::batch_size)
      .def_readwrite("steps", &RunRequest::steps)
      .def_readwrite("warmup", &RunRequest::warmup)
      .def_readwrite("workers", &RunRequest::workers)
      .def_readwrite("cudnn_benchmark", &RunRequest::cudnn_benchmark)
      .def_readwrite("cudnn_benchmark_limit", &RunRequest::cudnn_benchmark_limit)
      .def_readwrite("train_priority", &RunRequest::train_priority)
      .def_readwrite("input_priority", &RunRequest::input_priority)
      .def_readwrite("cuda_wait", &RunRequest::cuda_wait)
      .def_readwrite("trace_path", &RunRequest::trace_path)
      .def_readwrite("progress", &RunRequest::progress)
      .def_readwrite("gpu_monitor", &RunRequest::gpu_monitor)
      .def_readwrite("device_timing_every", &RunRequest::device_timing_every)
      .def_readwrite("seed", &RunRequest::seed)
      .def_readwrite("skip_bad", &RunRequest::skip_bad)
      .def_readwrite("first_step", &RunRequest::first_step)
      .def_readonly("rank", &RunRequest::rank)
      .def_readonly("world_size", &RunRequest::world_size)
      .def("describe", &run::describe_request, "The request's lines, as `tandem bench` prints them")
      .def("__repr__", [](const RunRequest& r) {
        return "<tandem RunRequest mode=" + run::mode_name(r.mode) + " device=" + r.device + ">";
      });

  py::class_<RunConfig>(m, "RunConfig",
                        "A tandem.Trainer's run: its Python objects and data beside the run "
                        "layer's RunRequest (trainer.py fills it)")
      .def(py::init<>())
      .def_readwrite("name", &RunConfig::name)
      .def_property(
          "instance", [](const RunConfig& c) { return held_or_none(c.instance); },
          [](RunConfig& c, py::object f) { c.instance = hold(std::move(f)); },
          "copies -> (feeds, model, loss_fn, optimizer, capturable, optimizer name, apply_lr)")
      .def_readwrite("copy", &RunConfig::copy)
      .def_property("data", &data_of, &set_data,
                    "a list of batches (dicts of tensors) or a tandem dataset; None: none set")
      .def_readwrite("shuffle", &RunConfig::shuffle)
      .def_readwrite("drop_last", &RunConfig::drop_last)
      .def_readwrite("input", &RunConfig::input)
      .def_property(
          "target", [](const RunConfig& c) { return c.target; },
          [](RunConfig& c, const std::optional<std::string>& t) { c.target = t.value_or(""); })
      .def_property(
          "augment", [](const RunConfig& c) { return c.augment.has_value(); }, &set_augment,
          "tandem.augment.Augment's fields as a dict, or None (reads: whether one is set)")
      .def_readwrite("augment_generator", &RunConfig::augment_generator)
      .def_readwrite("lr_schedule", &RunConfig::lr_schedule)
      .def_readwrite("data_parallel", &RunConfig::data_parallel)
      .def_readwrite(
          "request", &RunConfig::request,
          "the run layer's settings (RunRequest); set in place: config.request.steps = n")
      .def("resolved_request", &resolved_request,
           "The request with every default filled and every value checked by the run layer's "
           "resolve(), as `tandem bench` resolves its own");
}

py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

}  // namespace tandem::python
