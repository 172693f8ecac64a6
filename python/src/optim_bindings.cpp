// tandem._C's optimizers: tandem's capturable Sgd and Adam/AdamW (tandem/optim.h), for Python
// code that wants them (their learning rate lives on the device, so set_lr works under CUDA-graph
// replay) and for tandem.Trainer, which hands them to the runner as they are. tandem/optim.py
// wraps them in classes with torch.optim's constructor arguments.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <vector>

#include "tandem/optim.h"

namespace py = pybind11;

void bind_optim(py::module_& m) {
  using tandem::optim::Optimizer;
  py::class_<Optimizer, std::shared_ptr<Optimizer>>(m, "Optimizer",
                                                    "A tandem optimizer (tandem::optim)")
      .def(
          "step",
          [](Optimizer& o) {
            py::gil_scoped_release no_gil;
            o.step();
          },
          "one update on the current stream")
      .def(
          "zero_grad", [](Optimizer& o) { o.zero_grad(); }, "sets every gradient to None")
      .def(
          "set_lr", [](Optimizer& o, double lr) { o.set_lr(lr); },
          "enqueues a new learning rate on the current stream", py::arg("lr"))
      .def_property_readonly("capturable", &Optimizer::capturable)
      .def_property_readonly("name", &Optimizer::name)
      .def("parameters", &Optimizer::parameters)
      .def("state", &Optimizer::state, "(name, tensor) pairs: what a checkpoint keeps")
      .def("load_state", &Optimizer::load_state, py::arg("state"),
           "copies state() pairs in on the current stream (a buffer they do not name goes back "
           "to none)");
  py::class_<tandem::optim::Sgd, Optimizer, std::shared_ptr<tandem::optim::Sgd>>(m, "Sgd")
      .def(py::init([](std::vector<at::Tensor> params, double lr, double momentum, double dampening,
                       bool nesterov, double weight_decay) {
             tandem::optim::SgdOptions o;
             o.lr = lr;
             o.momentum = momentum;
             o.dampening = dampening;
             o.nesterov = nesterov;
             o.weight_decay = weight_decay;
             return std::make_shared<tandem::optim::Sgd>(std::move(params), o);
           }),
           py::arg("params"), py::arg("lr"), py::arg("momentum"), py::arg("dampening"),
           py::arg("nesterov"), py::arg("weight_decay"))
      .def_property_readonly("lr", &tandem::optim::Sgd::lr);
  py::class_<tandem::optim::Adam, Optimizer, std::shared_ptr<tandem::optim::Adam>>(m, "Adam")
      .def(py::init([](std::vector<at::Tensor> params, double lr, double beta1, double beta2,
                       double eps, double weight_decay, bool decoupled) {
             tandem::optim::AdamOptions o;
             o.lr = lr;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.eps = eps;
             o.weight_decay = weight_decay;
             o.decoupled_weight_decay = decoupled;
             return std::make_shared<tandem::optim::Adam>(std::move(params), o);
           }),
           py::arg("params"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
           py::arg("weight_decay"), py::arg("decoupled"))
      .def_property_readonly("lr", &tandem::optim::Adam::lr);
}
