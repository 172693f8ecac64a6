// tandem._C's convolution with kept cuDNN plans (tandem/models/tuned_conv.h): what
// tandem.Trainer's convolutions run (tandem/_conv_plans.py), and its plans file.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "tandem/models/tuned_conv.h"

namespace py = pybind11;

void bind_conv(py::module_& m) {
  m.def(
      "tuned_conv2d",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
         int64_t groups) {
        return tandem::models::tuned_conv2d(x, weight, bias.value_or(at::Tensor()), stride, padding,
                                            dilation, groups);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("groups"),
      "torch.nn.functional.conv2d's values and gradients with cuDNN plans timed once a shape in "
      "the process (all threads) and kept in the plans file; F.conv2d where it does not apply");
  m.def("conv_plans_summary", [] {
    const auto s = tandem::models::conv_plans_summary();
    py::dict d;
    d["tuned"] = s.tuned;
    d["from_file"] = s.from_file;
    d["untimed"] = s.untimed;
    d["refused"] = s.refused;
    d["runtime_compiled"] = s.runtime_compiled;
    d["from_compiled"] = s.from_compiled;
    d["configured"] = s.configured;
    d["prebuilt"] = s.prebuilt;
    d["tuning_s"] = s.tuning_seconds;
    d["rebuilding_s"] = s.rebuilding_seconds;
    d["listing_s"] = s.listing_seconds;
    d["graph_s"] = s.graph_seconds;
    d["building_s"] = s.building_seconds;
    d["warmup_ops"] = s.warmup_ops;
    d["warmup_s"] = s.warmup_seconds;
    return d;
  });
  m.def(
      "load_conv_plans",
      [](const std::string& path) {
        std::string note;
        const int64_t n = tandem::models::load_conv_plans(path, note);
        return py::make_tuple(n, note);
      },
      py::arg("path"), "(plans read, a note where the file was ignored)");
  m.def(
      "save_conv_plans",
      [](const std::string& path) {
        std::string error;
        if (!tandem::models::save_conv_plans(path, error)) throw std::runtime_error(error);
      },
      py::arg("path"));
  m.def("clear_conv_plans", &tandem::models::clear_conv_plans);
  m.def("set_conv_plans_job", &tandem::models::set_conv_plans_job, py::arg("job"),
        "names the job whose convolutions run next: the plans they use are noted as its");
  m.def(
      "prebuild_conv_plans",
      [](const std::string& job, int threads) {
        py::gil_scoped_release released;  // its threads take no Python
        return tandem::models::prebuild_conv_plans(job, threads);
      },
      py::arg("job"), py::arg("threads"),
      "builds the job's kept plans for the current GPU on `threads` threads; how many it built");
  m.def("conv_plans_unsaved", &tandem::models::conv_plans_unsaved);
}
