// tandem._C: the extension module. Loading it registers the torch operators (augment_op.cpp);
// the functions here tell the Python side what the C++ library's defaults are, so the Python
// AugmentSpec cannot drift from tandem::AugmentSpec.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "tandem/augment.h"
#include "tandem/error.h"
#include "tandem/mode.h"

namespace py = pybind11;

void bind_data(py::module_& m);            // data_bindings.cpp
void bind_python_dataset(py::module_& m);  // python_dataset.cpp
void bind_optim(py::module_& m);           // optim_bindings.cpp
void bind_trainer(py::module_& m);         // trainer_bindings.cpp
void bind_job(py::module_& m);             // job_bindings.cpp
void bind_conv(py::module_& m);            // conv_bindings.cpp
#ifdef TANDEM_PY_HAVE_TRAIN
void bind_train(py::module_& m);  // train_bindings.cpp
#endif
namespace tandem::python {
void bind_run_config(py::module_& m);  // python_workload.cpp
}  // namespace tandem::python

PYBIND11_MODULE(_C, m) {
  // A bad argument the C++ library names is a ValueError in Python (other tandem errors are
  // RuntimeErrors, as std::runtime_error). Local: for this module's functions only — torch's
  // own exception handling (its operators, torch.ops.tandem.* included) stays untouched.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tandem::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  bind_data(m);
  bind_python_dataset(m);
  bind_optim(m);
  tandem::python::bind_run_config(m);
  bind_trainer(m);
  bind_job(m);
  bind_conv(m);
#ifdef TANDEM_PY_HAVE_TRAIN
  bind_train(m);
#endif
  m.doc() = "tandem's C++ extension: torch.ops.tandem.* and the library's defaults";
  m.def(
      "augment_spec_defaults",
      [] {
        const tandem::AugmentSpec s;
        py::dict d;
        d["crop"] = py::make_tuple(s.crop_h, s.crop_w);
        d["out"] = py::make_tuple(s.out_h, s.out_w);
        d["max_rotation_deg"] = s.max_rotation_deg;
        d["blur_kernel"] = s.blur_kernel;
        d["sigma_min"] = s.sigma_min;
        d["sigma_max"] = s.sigma_max;
        d["mean"] = py::tuple(py::cast(s.mean));
        d["std"] = py::tuple(py::cast(s.std));
        d["hflip_probability"] = s.hflip_probability;
        return d;
      },
      "tandem::AugmentSpec's defaults, by field");
  m.def(
      "modes",
      [] {
        std::vector<std::tuple<std::string, std::string, bool>> out;
        for (const tandem::Mode mode : tandem::workload_modes())
          out.emplace_back(tandem::to_string(mode), tandem::describe(mode),
                           tandem::captures_graphs(mode));
        return out;
      },
      "the library's mode table, simplest first: (name, description, captures CUDA graphs)");
}
