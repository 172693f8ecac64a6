// tandem._C's data classes: tandem's datasets (ImageFolder, image + mask pairs, IDX) and its
// Loader — C++ worker threads filling a ring of pinned slots — as a Python iterable of batches,
// usable in any PyTorch loop. No GIL while a batch is awaited; a batch handed to Python is a
// device copy (enqueued on the current stream, the slot refilled only after it) or a host copy,
// never a view into a slot the workers will overwrite.
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>

#include "py_dataset.h"
#include "tandem/detail/lane.h"
#include "tandem/loader.h"
#include "tandem/random_dataset.h"
#include "tandem/sampler.h"
#ifdef TANDEM_PY_HAVE_DATA
#include "tandem/data/decode.h"
#include "tandem/data/idx.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/image_mask_pairs.h"
#endif

namespace py = pybind11;

namespace {

/// One pass over a dataset: the batches of an epoch, in order.
class PyEpoch {
 public:
  PyEpoch(const PyDataset& data, tandem::LoaderOptions options, std::optional<c10::Device> device)
      : loader_(std::make_unique<tandem::Loader>(data.dataset, std::move(options))),
        device_(device) {
    for (const auto& f : loader_->fields()) names_.push_back(f.name);
  }
  /// The workers may be waiting for the GIL (a Python dataset's __getitem__): joining them
  /// while holding it would never end.
  ~PyEpoch() {
    py::gil_scoped_release no_gil;
    loader_.reset();
  }
  int64_t size() const { return loader_->num_batches(); }

  py::dict next() {
    std::optional<tandem::HostBatch> b;
    {
      py::gil_scoped_release no_gil;  // workers fill while Python waits
      b = loader_->next();
    }
    if (!b) throw py::stop_iteration();
    py::dict out;
    if (device_ && device_->is_cuda()) {
      const tandem::Lane lane = tandem::Lane::current("python", *device_);
      for (size_t i = 0; i < names_.size(); ++i)
        out[py::str(names_[i])] = b->fields[i].to(*device_, /*non_blocking=*/true);
      loader_->release(*b, &lane);  // refilled after the copies on this stream complete
    } else {
      for (size_t i = 0; i < names_.size(); ++i) out[py::str(names_[i])] = b->fields[i].clone();
      loader_->release(*b);
    }
    out["indices"] = at::tensor(b->indices, at::kLong);
    return out;
  }

  std::vector<std::pair<int64_t, std::string>> skipped() const {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const auto& s : loader_->skipped()) out.emplace_back(s.index, s.reason);
    return out;
  }

 private:
  std::unique_ptr<tandem::Loader> loader_;
  std::optional<c10::Device> device_;
  std::vector<std::string> names_;
};

}  // namespace

void bind_data(py::module_& m) {
  // Subclassed in Python (tandem.data.ImageFolder, ...): a subclass's __init__ hands the base
  // the dataset one of the functions below made, which the instance then shares.
  py::class_<PyDataset>(m, "Dataset", "A tandem dataset (read by the C++ loader's workers)")
      .def(py::init([](const PyDataset& made) { return PyDataset{made.dataset}; }),
           py::arg("dataset"))
      .def("__len__", &PyDataset::size)
      .def_property_readonly("fields", &PyDataset::fields);
#ifdef TANDEM_PY_HAVE_DATA
  m.def(
      "image_folder",
      [](const std::string& root, int64_t image_size, int64_t channels) {
        tandem::data::ImageFolderOptions o;
        o.image_size = image_size;
        o.channels = channels;
        return PyDataset{std::make_shared<tandem::data::ImageFolderDataset>(root, o)};
      },
      py::arg("root"), py::arg("image_size") = 224, py::arg("channels") = 3);
  m.def(
      "image_mask_pairs",
      [](const std::string& root, int64_t classes, int64_t image_size, int64_t ignore_index) {
        tandem::data::ImageMaskPairsOptions o;
        o.classes = classes;
        o.image_size = image_size;
        o.ignore_index = ignore_index;
        return PyDataset{std::make_shared<tandem::data::ImageMaskPairs>(root, o)};
      },
      py::arg("root"), py::arg("classes"), py::arg("image_size") = 512,
      py::arg("ignore_index") = 255);
  m.def(
      "idx",
      [](const std::string& images, const std::string& labels) {
        return PyDataset{std::make_shared<tandem::data::IdxDataset>(images, labels)};
      },
      py::arg("images"), py::arg("labels"));
  // The loader workers' decode for one image, without the GIL (threads decode in parallel).
  m.def(
      "decode_image",
      [](const py::bytes& data, int64_t channels, int64_t min_size, bool interleaved,
         const std::string& name) {
        const std::string_view view(data);
        const std::vector<uint8_t> bytes(view.begin(), view.end());
        py::gil_scoped_release no_gil;
        return interleaved ? tandem::data::decode_image_interleaved(bytes, name, channels, min_size,
                                                                    min_size)
                           : tandem::data::decode_image(bytes, name, channels, min_size, min_size);
      },
      py::arg("data"), py::arg("channels"), py::arg("min_size"), py::arg("interleaved"),
      py::arg("name"));
  m.def(
      "encode_image",
      [](const at::Tensor& image, const std::string& format, int quality) {
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release no_gil;
          out = format == "png" ? tandem::data::encode_png(image)
                                : tandem::data::encode_jpeg(image, quality);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("image"), py::arg("format"), py::arg("quality"));
#endif
  m.def(
      "random_dataset",
      [](const std::vector<
             std::tuple<std::string, std::vector<int64_t>, at::ScalarType, double, double>>& fields,
         int64_t size, uint64_t seed) {
        std::vector<tandem::RandomField> f;  // RandomDataset checks each (dtype included)
        for (const auto& [name, shape, dtype, low, high] : fields)
          f.push_back({name, shape, dtype, low, high});
        return PyDataset{std::make_shared<tandem::RandomDataset>(std::move(f), size, seed)};
      },
      py::arg("fields"), py::arg("size"), py::arg("seed"));
  py::class_<PyEpoch>(m, "Epoch", "One epoch of batches from the C++ loader")
      .def("__len__", &PyEpoch::size)
      .def(
          "__iter__", [](PyEpoch& e) -> PyEpoch& { return e; }, py::return_value_policy::reference)
      .def("__next__", &PyEpoch::next)
      .def("skipped", &PyEpoch::skipped);
  m.def(
      "epoch",
      [](const PyDataset& data, int64_t batch_size, int workers, int depth, bool shuffle,
         uint64_t seed, int64_t epoch, bool drop_last, bool skip_bad,
         std::optional<std::string> device, int64_t rank, int64_t world_size, int worker_nice) {
        tandem::LoaderOptions o;
        o.batch_size = batch_size;
        o.workers = workers;
        o.worker_nice = worker_nice;
        o.depth = depth > 0 ? depth : tandem::ring_slots_for(workers);
        o.drop_last = drop_last;
        o.skip_bad = skip_bad;
        o.seed = seed;
        // PyTorch's DistributedSampler order for this rank of world_size (one process: rank 0 of
        // 1): torch.randperm seeded seed + epoch, every world_size-th index from rank.
        if (shuffle || world_size > 1)
          o.indices = tandem::DistributedSampler(data.size(), world_size, rank, shuffle, seed)
                          .indices(epoch);
        std::optional<c10::Device> dev;
        if (device) dev = c10::Device(*device);
        o.pin_memory = dev && dev->is_cuda();
        return std::make_unique<PyEpoch>(data, o, dev);
      },
      py::arg("dataset"), py::arg("batch_size"), py::arg("workers"), py::arg("depth"),
      py::arg("shuffle"), py::arg("seed"), py::arg("epoch"), py::arg("drop_last"),
      py::arg("skip_bad"), py::arg("device"), py::arg("rank") = 0, py::arg("world_size") = 1,
      py::arg("worker_nice") = 0);
}
