// tandem.data.TorchDataset: a map-style Python dataset (torch.utils.data.Dataset: __len__ and
// __getitem__) as a tandem Dataset, so the C++ loader and tandem.Trainer read a user's own data.
// The loader's worker threads call __getitem__ under the GIL — one at a time, so this suits
// datasets whose items are cheap or release the GIL (tensor ops, file reads); decoding in
// Python serializes on it, which is what tandem.data's C++ datasets exist for — then copy the
// sample into the batch slot without the GIL. Every sample must have sample 0's fields, shapes
// and dtypes (the loader's slots are fixed-size).
#include <ATen/ops/from_blob.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "py_dataset.h"
#include "python_calls.h"
#include "tandem/loader.h"

namespace py = pybind11;

namespace tandem::python {
namespace {

class PythonDataset : public Dataset {
 public:
  /// Call with the GIL. `names`: the fields' names, or empty for sample 0's own (a dict's keys;
  /// "input", "target" for a pair; "field0", ... otherwise).
  PythonDataset(const py::object& dataset, std::vector<std::string> names)
      : dataset_(hold(dataset)), size_(static_cast<int64_t>(py::len(dataset))) {
    if (size_ == 0) throw py::value_error("the dataset is empty: expected at least one sample");
    const std::vector<at::Tensor> first = sample(0, &names);
    for (size_t i = 0; i < first.size(); ++i)
      fields_.push_back({names[i], first[i].sizes().vec(), first[i].scalar_type()});
  }
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override { return fields_; }

  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    std::vector<at::Tensor> s;
    {
      py::gil_scoped_acquire gil;
      try {
        s = sample(index, nullptr);
      } catch (py::error_already_set& e) {
        throw Error(raised("__getitem__(" + std::to_string(index) + ")", e));
      } catch (py::builtin_exception& e) {
        throw Error(e.what());
      }
    }
    for (size_t i = 0; i < fields_.size(); ++i) {  // copied without the GIL
      const FieldSpec& f = fields_[i];
      TANDEM_CHECK_ARG(s[i].sizes() == at::IntArrayRef(f.shape) && s[i].scalar_type() == f.dtype,
                       "sample ", index, " field '", f.name, "' is ", s[i].scalar_type(), " ",
                       s[i].sizes(), ": expected ", f.dtype, " ", at::IntArrayRef(f.shape),
                       " as sample 0 (every sample of a batch has one shape)");
      out.at(i).copy_(s[i]);
    }
  }

 private:
  /// Sample `index` as CPU tensors, in the fields' order. Call with the GIL. With `names`,
  /// fills the names in (sample 0) instead of checking against them.
  std::vector<at::Tensor> sample(int64_t index, std::vector<std::string>* names) const {
    const py::object item = (*dataset_)[py::int_(index)];
    std::vector<py::object> values;
    std::vector<std::string> keys;
    if (py::isinstance<py::dict>(item)) {
      for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(item)) {
        keys.push_back(py::str(k));
        values.push_back(py::reinterpret_borrow<py::object>(v));
      }
    } else if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
      for (const py::handle v : item) values.push_back(py::reinterpret_borrow<py::object>(v));
    } else {
      values.push_back(item);
    }
    if (names) {
      if (names->empty()) {
        if (!keys.empty()) {
          *names = keys;
        } else if (values.size() <= 2) {
          *names = {"input", "target"};
        } else {
          for (size_t i = 0; i < values.size(); ++i) names->push_back("field" + std::to_string(i));
        }
        names->resize(values.size());
      }
      if (names->size() != values.size())
        throw py::value_error("fields names " + std::to_string(names->size()) +
                              " fields, but sample 0 has " + std::to_string(values.size()));
    } else if (values.size() != fields_.size()) {
      throw py::value_error("sample " + std::to_string(index) + " has " +
                            std::to_string(values.size()) + " fields: expected " +
                            std::to_string(fields_.size()) + ", as sample 0");
    } else if (!keys.empty()) {
      for (size_t i = 0; i < keys.size(); ++i)
        if (keys[i] != fields_[i].name)
          throw py::value_error("sample " + std::to_string(index) + " has key '" + keys[i] +
                                "' where sample 0 has '" + fields_[i].name + "'");
    }
    // Never destroyed: a static py::object would be released after the interpreter is gone.
    static const py::object* const as_tensor =
        new py::object(py::module_::import("torch").attr("as_tensor"));
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < values.size(); ++i) {
      at::Tensor t = THPVariable_Unpack((*as_tensor)(values[i]).ptr());
      if (!t.device().is_cpu())
        throw py::value_error("sample " + std::to_string(index) + " field " + std::to_string(i) +
                              " is on " + t.device().str() +
                              ": expected CPU samples (the loader copies batches to the device)");
      out.push_back(t.detach().contiguous());
    }
    return out;
  }

  PyRef dataset_;
  int64_t size_;
  std::vector<FieldSpec> fields_;
};

}  // namespace
}  // namespace tandem::python

void bind_python_dataset(py::module_& m) {
  m.def(
      "python_dataset",
      [](const py::object& dataset, std::vector<std::string> names) {
        return PyDataset{
            std::make_shared<tandem::python::PythonDataset>(dataset, std::move(names))};
      },
      py::arg("dataset"), py::arg("names"),
      "A map-style Python dataset (len and indexing) read by the C++ loader's workers");
}
