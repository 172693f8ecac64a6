// Workload "cls": model, synthetic dataset, and its stages as a Workload.
#include "tandem/workloads/cls.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "tandem/augmented_dataset.h"
#include "tandem/detail/sample_rng.h"
#include "tandem/error.h"
#include "tandem/models/reference_nets.h"
#include "tandem/optim.h"
#include "tandem/workloads/registry.h"
#include "tandem/workloads/seg.h"

namespace tandem {

ClsDataset::ClsDataset(int64_t size, uint64_t seed, bool learnable, int64_t image_size,
                       int64_t classes)
    : size_(size), seed_(seed), learnable_(learnable), image_size_(image_size), classes_(classes) {
  TANDEM_CHECK_ARG(size >= 0, "dataset size ", size, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(classes > 0 && classes <= 256, "class count ", classes,
                   " is not valid: expected 1..256");
}

std::vector<FieldSpec> ClsDataset::fields() const {
  return {{"image", {3, image_size_, image_size_}, at::kByte}, {"label", {}, at::kLong}};
}

void ClsDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TORCH_CHECK(index >= 0 && index < size_, "sample index ", index, " is outside [0, ", size_, ")");
  SampleRng rng(seed_, static_cast<uint64_t>(index));
  int64_t label;
  rng.fill_below(&label, 1, static_cast<uint32_t>(learnable_ ? 2 : classes_));
  uint8_t* image = static_cast<uint8_t*>(out.at(0).data_ptr());
  const int64_t n = out[0].numel();
  rng.fill_bytes(image, n);
  if (learnable_)  // class 0: dark pixels in [0, 64); class 1: bright ones in [192, 256)
    for (int64_t i = 0; i < n; ++i) image[i] = static_cast<uint8_t>(label * 192 + image[i] % 64);
  *out.at(1).data_ptr<int64_t>() = label;
}

namespace {
const std::vector<WorkloadParam>& cls_params() {
  static const std::vector<WorkloadParam> params{
      {"augment",
       "where the augmentation runs: gpu (a feed stage on its own lane, the fused kernel) or cpu "
       "(the loader's workers, the C++ reference: the Python loops' cpu_aug)",
       {"gpu", "cpu"}},
      {"task",
       "random (the reference workload's random labels) or learnable (a toy task: dark vs bright "
       "images)",
       {"random", "learnable"}}};
  return params;
}
}  // namespace

ClsWorkload make_cls(const WorkloadOptions& options, ClsOptions cls) {
  check_params("cls", options.params, cls_params());
  if (options.params.count("augment"))
    cls.augment_on = param_or_default(options.params, cls_params(), "augment") == "cpu"
                         ? AugmentOn::kCpu
                         : AugmentOn::kGpu;
  if (options.params.count("task"))
    cls.learnable = param_or_default(options.params, cls_params(), "task") == "learnable";
  cls.augment.validate(3, kClsImageSize, kClsImageSize);
  torch::manual_seed(options.seed);
  ClsWorkload c;
  c.model = models::reference_cls_net(kClsClasses);
  c.model->to(options.device);
  c.model->train();

  Workload& w = c.workload;
  w.name = "cls";
  w.device = options.device;
  const uint64_t seed = options.data_seed();  // data and augmentation: per rank
  const bool learnable = cls.learnable;
  const AugmentSpec spec = cls.augment;
  if (cls.augment_on == AugmentOn::kCpu) {
    w.data = DataSource::sized_to_run([seed, learnable, spec](int64_t samples) {
      return std::make_shared<AugmentedDataset>(
          std::make_shared<ClsDataset>(samples, seed, learnable), spec, seed);
    });
  } else {
    w.data = DataSource::sized_to_run([seed, learnable](int64_t samples) {
      return std::make_shared<ClsDataset>(samples, seed, learnable);
    });
    // The parameters are drawn from one generator per workload instance, seeded, in step
    // order and the same amount each step, so every mode draws the same ones for a step; the
    // graph that draws registers it (FeedStage::generators), so a replay draws what an eager
    // step would.
    // (B, 3, 256, 256) uint8 in, (B, 3, out_h, out_w) float32 out.
    w.feeds.push_back(augment_feed(spec, seeded_generator(options.device, seed)));
  }
  auto model = c.model.ptr();           // shared_ptr: forward() from a const lambda
  w.train.inputs = {"image", "label"};  // (B, 3, H, W) float32, (B,) int64
  w.train.loss = [model](const Tensors& in) {
    return deterministic_cross_entropy(model->forward(in[0]), in[1]);  // (B, 10)
  };
  w.train.optimizer = std::make_shared<optim::Sgd>(c.model->parameters(), cls.lr);
  w.train.what = "forward, cross-entropy";
  return c;
}

WorkloadEntry cls_entry() {
  return {"cls",
          "9-conv classifier trained through heavy per-sample augmentation, 256x256 "
          "(docs/reference-workloads.md)",
          32,
          2,
          cls_params(),
          [](const WorkloadOptions& o) { return make_cls(o).workload; }};
}

}  // namespace tandem
