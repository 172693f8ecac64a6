// Workload "cls" (SPEC.md): 10-class classification of 256x256 images by the 9-conv stack plus a
// linear head, with heavy per-sample augmentation. Modes: cpu_aug (loader workers augment on the
// CPU, as a DataLoader with workers), gpu_aug (copy, augment, train on one lane), pipelined
// (copy lane -> augment lane -> train lane: augment batch n+1 while training on batch n),
// graphed (gpu_aug with everything after the load as one CUDA graph) and pipelined+graphed
// (pipelined, the augment and train stages each a graph).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

#include "tandem/augment.h"
#include "tandem/graphed_stage.h"
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

/// The cls scenario. Stages by mode (load — loader and H2D copy — stays eager in every mode):
///
///   cpu_aug:            load (the loader's workers augment) -> train
///   gpu_aug, pipelined: load -> augment (draw parameters, fused kernel) -> train
///   graphed:            load -> step (augment and train as one graph), one lane
///   pipelined+graphed:  load -> augment (a graph on the augment lane)
///                            -> train (a graph on the train lane)
///
/// Every GPU mode draws the augmentation parameters from one per-run CUDA generator, in step
/// order, the same amount each step; the graphs register it (GraphOptions::generators), so a
/// replay draws the next step's parameters exactly as an eager step would: gpu_aug, pipelined,
/// graphed and pipelined+graphed compute the same losses.
class ClsScenario : public Scenario {
 public:
  ClsScenario(const ScenarioOptions& options, ClsOptions cls = {});
  ~ClsScenario() override;

  std::string name() const override { return "cls"; }
  inline static const std::vector<std::string> kModes{"cpu_aug", "gpu_aug", "pipelined",
                                                      "graphed", "pipelined+graphed"};
  std::vector<std::string> modes() const override { return kModes; }
  std::unique_ptr<Pipeline> prepare(const std::string& mode, int64_t num_steps) override;
  std::vector<float> losses() const override;
  std::vector<std::string> notes() const override;

  torch::nn::Sequential& model() { return model_; }

 private:
  /// (B, 3, 256, 256) uint8 -> (B, 3, out_h, out_w) float32, with parameters drawn from
  /// `generator_`. Capture-safe when the graph registers the generator.
  at::Tensor augment_images(const at::Tensor& images);
  /// One training step on augmented images and (B,) int64 labels; returns the loss, 0-dim.
  at::Tensor train_step(const at::Tensor& images, const at::Tensor& labels);

  void augment_stage(Batch& batch, const Lane& lane);
  void train(Batch& batch, const Lane& lane);
  void step_graphed(Batch& batch, const Lane& lane);
  void augment_graphed(Batch& batch, const Lane& lane);
  void train_graphed(Batch& batch, const Lane& lane);

  ScenarioOptions options_;
  ClsOptions cls_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<optim::Sgd> optimizer_;
  std::unique_ptr<Loader> loader_;
  at::Generator generator_;  // draws augmentation parameters on the device, in step order
  at::Tensor losses_;        // (num_steps,) float32 on the device

  // Graphed modes: `step_` (graphed) or `augment_` and `train_` (pipelined+graphed), rebuilt by
  // each prepare(); each is used by its stage's thread only.
  std::string mode_;
  std::unique_ptr<GraphedStage> step_, augment_, train_;
};

}  // namespace tandem
