// Workload "cls" (docs/reference-workloads.md): 10-class classification of 256x256 images by the
// 9-conv stack plus a linear head, with heavy per-sample augmentation. Where the augmentation runs
// is a data-source choice (param augment): gpu — a feed stage on lane "augment" (parameters drawn
// on the device from the run's generator, the fused kernel) — or cpu — the loader's workers run the
// C++ reference (AugmentedDataset), as a PyTorch DataLoader with workers does (the Python reference
// loops' cpu_aug).
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "tandem/augment.h"
#include "tandem/loader.h"
#include "tandem/workload.h"

namespace tandem {

constexpr int64_t kClsImageSize = 256;
constexpr int64_t kClsClasses = 10;
constexpr double kClsLearningRate = 1e-3;  // torch.optim.SGD's default, as the reference uses

// The network: models::reference_cls_net() (tandem/models/reference_nets.h).

/// Random uint8 images (3, S, S) and int64 labels () in [0, classes), a pure function of
/// (seed, index). `learnable`: a toy task a model can learn through the augmentation, for
/// tests: labels 0 or 1, class 0 dark pixels in [0, 64), class 1 bright ones in [192, 256);
/// otherwise labels are random in [0, classes), as the reference workloads' are.
class ClsDataset : public Dataset {
 public:
  ClsDataset(int64_t size, uint64_t seed, bool learnable = false,
             int64_t image_size = kClsImageSize, int64_t classes = kClsClasses);
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override;
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;

 private:
  int64_t size_;
  uint64_t seed_;
  bool learnable_;
  int64_t image_size_, classes_;
};

enum class AugmentOn { kGpu, kCpu };

struct ClsOptions {
  AugmentSpec augment;  ///< the reference pipeline by default
  AugmentOn augment_on = AugmentOn::kGpu;
  bool learnable = false;  ///< the toy task of ClsDataset
  double lr = kClsLearningRate;
};

struct ClsWorkload {
  Workload workload;
  torch::nn::Sequential model{nullptr};
};
/// The model seeded from options.seed on options.device; synthetic data sized to each run.
/// options.params (augment=gpu|cpu, task=random|learnable) override `cls`.
ClsWorkload make_cls(const WorkloadOptions& options, ClsOptions cls = {});
WorkloadEntry cls_entry();

}  // namespace tandem
