// Workload "seg" (docs/reference-workloads.md): a frozen 9-conv encoder feeding a trainable 9-layer
// decoder, trained for 10-class segmentation of 256x256 images. Two stages: encode (a feed:
// uint8->float, frozen encoder, on lane "encoder") and train (decoder, cross-entropy, SGD, on lane
// "decoder"). The frozen encoder makes pipelining exact: every mode computes serial's losses.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "tandem/loader.h"
#include "tandem/workload.h"

namespace tandem {

constexpr int64_t kSegImageSize = 256;
constexpr int64_t kSegClasses = 10;
constexpr double kSegLearningRate = 1e-3;  // torch.optim.SGD's default, as the reference uses

// The networks: models::reference_seg_encoder() and reference_seg_decoder()
// (tandem/models/reference_nets.h).

/// Random uint8 images (3, S, S) and int64 label maps (S, S) in [0, classes); sample i is a
/// pure function of (seed, i), so any worker produces the same bytes for it.
class SegDataset : public Dataset {
 public:
  SegDataset(int64_t size, uint64_t seed, int64_t image_size = kSegImageSize,
             int64_t classes = kSegClasses);
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override;
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;

 private:
  int64_t size_;
  uint64_t seed_;
  int64_t image_size_;
  int64_t classes_;
};

/// The workload and its models (tests read the decoder's weights).
struct SegWorkload {
  Workload workload;
  torch::nn::Sequential encoder{nullptr}, decoder{nullptr};
};
/// Models seeded from options.seed on options.device; synthetic data sized to each run.
SegWorkload make_seg(const WorkloadOptions& options);
WorkloadEntry seg_entry();

}  // namespace tandem
