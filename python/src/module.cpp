// tandem._C: the extension module. Loading it registers the torch operators (augment_op.cpp);
// the functions here tell the Python side what the C++ library's defaults are, so the Python
// AugmentSpec cannot drift from tandem::AugmentSpec.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "tandem/augment.h"

namespace py = pybind11;

void bind_data(py::module_& m);  // data_bindings.cpp

PYBIND11_MODULE(_C, m) {
  bind_data(m);
  m.doc() = "tandem's C++ extension: torch.ops.tandem.* and the library's defaults";
  m.def("augment_spec_defaults", [] {
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
  }, "tandem::AugmentSpec's defaults, by field");
}
