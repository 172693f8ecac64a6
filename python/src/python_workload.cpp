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
  b.stages_to_overlap = d["stages_to_overlap"].cast<bool>();
  for (const auto& [mode, why] : d["ruled_out"].cast<py::dict>())
    b.ruled_out[parse_mode(mode.cast<std::string>())] = why.cast<std::string>();
  return c;
}

py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

}  // namespace tandem::python
