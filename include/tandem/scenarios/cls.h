// Workload "cls" (SPEC.md): 10-class classification of 256x256 images by the 9-conv stack plus a
// linear head, with heavy per-sample augmentation. Modes: cpu_aug (loader workers augment on the
// CPU, as a DataLoader with workers), gpu_aug (copy, augment, train on one lane), pipelined
// (copy lane -> augment lane -> train lane: augment batch n+1 while training on batch n).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

#include "tandem/augment.h"
#include "tandem/loader.h"
#include "tandem/optim.h"
#include "tandem/scenario.h"

namespace tandem {

constexpr int64_t kClsImageSize = 256;
constexpr int64_t kClsClasses = 10;
constexpr double kClsLearningRate = 1e-3;  // torch.optim.SGD's default, as the reference uses

/// The seg encoder's 9 convolutions (ReLU after all but the last), Flatten, Linear(4096 -> 10).
/// (N, 3, 256, 256) float -> (N, 10). 44,787,754 parameters.
torch::nn::Sequential make_cls_model();

/// Random uint8 images (3, S, S) and int64 labels () in [0, classes), a pure function of
/// (seed, index). `learnable`: a toy task a model can learn through the augmentation, for
/// tests: labels 0 or 1, class 0 dark pixels in [0, 64), class 1 bright ones in [192, 256);
/// otherwise labels are random in [0, classes), as SPEC's.
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

/// A dataset whose images come out augmented (float32, C x out_h x out_w): each loader worker
/// augments its samples with the C++ reference and per-sample parameters drawn on the host from
/// (seed, index). This is cpu_aug mode's data path.
class AugmentedDataset : public Dataset {
 public:
  AugmentedDataset(std::shared_ptr<const Dataset> source, AugmentSpec spec, uint64_t seed);
  int64_t size() const override { return source_->size(); }
  std::vector<FieldSpec> fields() const override;
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;

 private:
  std::shared_ptr<const Dataset> source_;
  AugmentSpec spec_;
  uint64_t seed_;
  std::vector<FieldSpec> source_fields_;
};

struct ClsOptions {
  AugmentSpec augment;           ///< SPEC's pipeline by default
  bool learnable = false;        ///< the toy task of ClsDataset
  double lr = kClsLearningRate;
};

class ClsScenario : public Scenario {
 public:
  ClsScenario(const ScenarioOptions& options, ClsOptions cls = {});
  ~ClsScenario() override;

  std::string name() const override { return "cls"; }
  inline static const std::vector<std::string> kModes{"cpu_aug", "gpu_aug", "pipelined"};
  std::vector<std::string> modes() const override { return kModes; }
  std::unique_ptr<Pipeline> prepare(const std::string& mode, int64_t num_steps) override;
  std::vector<float> losses() const override;

  torch::nn::Sequential& model() { return model_; }

 private:
  void augment_stage(Batch& batch, const Lane& lane);
  void train(Batch& batch, const Lane& lane);

  ScenarioOptions options_;
  ClsOptions cls_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<optim::Sgd> optimizer_;
  std::unique_ptr<Loader> loader_;
  at::Generator generator_;  // draws augmentation parameters on the device, in step order
  at::Tensor losses_;        // (num_steps,) float32 on the device
};

}  // namespace tandem
