// Workload "seg": models, synthetic dataset, and its two stages as a Workload.
#include "tandem/workloads/seg.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cstring>
#include <memory>

#include "tandem/detail/sample_rng.h"
#include "tandem/error.h"
#include "tandem/models/reference_nets.h"
#include "tandem/workloads/registry.h"

namespace tandem {

SegDataset::SegDataset(int64_t size, uint64_t seed, int64_t image_size, int64_t classes)
    : size_(size), seed_(seed), image_size_(image_size), classes_(classes) {
  TANDEM_CHECK_ARG(size >= 0, "dataset size ", size, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(image_size > 0, "image size ", image_size, " is not valid: expected > 0");
  TANDEM_CHECK_ARG(classes > 0 && classes <= 256, "class count ", classes,
                   " is not valid: expected 1..256");
}

std::vector<FieldSpec> SegDataset::fields() const {
  return {{"image", {3, image_size_, image_size_}, at::kByte},
          {"label", {image_size_, image_size_}, at::kLong}};
}

void SegDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TORCH_CHECK(index >= 0 && index < size_, "sample index ", index, " is outside [0, ", size_, ")");
  SampleRng rng(seed_, static_cast<uint64_t>(index));
  rng.fill_bytes(static_cast<uint8_t*>(out.at(0).data_ptr()), out[0].numel());
  rng.fill_below(out.at(1).data_ptr<int64_t>(), out[1].numel(), static_cast<uint32_t>(classes_));
}

SegWorkload make_seg(const WorkloadOptions& options) {
  check_params("seg", options.params, {});
  torch::manual_seed(options.seed);
  SegWorkload s;
  s.encoder = models::reference_seg_encoder();
  s.decoder = models::reference_seg_decoder(kSegClasses);
  s.encoder->to(options.device);
  s.decoder->to(options.device);
  s.encoder->eval();
  for (auto& p : s.encoder->parameters()) p.set_requires_grad(false);
  s.decoder->train();

  Workload& w = s.workload;
  w.name = "seg";
  w.device = options.device;
  const uint64_t seed = options.data_seed();
  w.data = DataSource::sized_to_run(
      [seed](int64_t samples) { return std::make_shared<SegDataset>(samples, seed); });
  auto encoder = s.encoder.ptr();  // shared_ptrs: forward() from const lambdas
  auto decoder = s.decoder.ptr();
  // (B, 3, 256, 256) uint8 -> (B, 4096, 1, 1) float, no rescale (as the Python reference loops).
  w.feeds.push_back(
      {"encode",
       "encoder",
       {"image"},
       {"features"},
       [encoder](const Tensors& in) { return Tensors{encoder->forward(in[0].to(at::kFloat))}; },
       "uint8->float, frozen encoder",
       {}});
  w.train.lane = "decoder";
  w.train.inputs = {"features", "label"};  // (B, 4096, 1, 1) float, (B, 256, 256) int64
  w.train.loss = [decoder](const Tensors& in) {
    return deterministic_cross_entropy(decoder->forward(in[0]), in[1]);  // (B, 10, 256, 256)
  };
  w.train.optimizer = std::make_shared<optim::Sgd>(s.decoder->parameters(), kSegLearningRate);
  w.train.what = "decoder forward, cross-entropy";
  return s;
}

WorkloadEntry seg_entry() {
  return {"seg",
          "frozen 9-conv encoder + trainable decoder, 256x256 segmentation "
          "(docs/reference-workloads.md)",
          8,
          2,
          {},
          [](const WorkloadOptions& o) { return make_seg(o).workload; }};
}

}  // namespace tandem
