// Workload "seg" (SPEC.md): a frozen 9-conv encoder feeding a trainable 9-layer decoder, trained
// for 10-class segmentation of 256x256 images. Modes: serial, pipelined (the encoder works on
// batch n+1 on its lane while the decoder trains on batch n on another), graphed (everything
// after the load as one CUDA graph) and pipelined+graphed (pipelined, each GPU stage a graph).
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <memory>

#include "tandem/graphed_stage.h"
#include "tandem/loader.h"
#include "tandem/optim.h"
#include "tandem/scenario.h"

namespace tandem {

constexpr int64_t kSegImageSize = 256;
constexpr int64_t kSegClasses = 10;
constexpr double kSegLearningRate = 1e-3;  // torch.optim.SGD's default, as the reference uses

/// Conv2d(3->16, k1), then eight Conv2d k2 s2 doubling 16->4096; ReLU after all but the last.
/// (N, 3, 256, 256) float -> (N, 4096, 1, 1). 44,746,784 parameters.
torch::nn::Sequential make_seg_encoder();
/// Eight ConvTranspose2d k2 s2 halving 4096->16, ReLU after each, then Conv2d(16->10, k3, p1).
/// (N, 4096, 1, 1) -> (N, 10, 256, 256). 44,744,090 parameters.
torch::nn::Sequential make_seg_decoder();

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

/// The seg scenario. Stages by mode (the load stage — loader and H2D copy on the copy lane — is
/// host-driven and stays eager in every mode):
///
///   serial, pipelined:  load -> encode (uint8->float, frozen encoder, no grad)
///                            -> train (decoder forward, cross-entropy, backward, SGD step)
///   graphed:            load -> step (encode and train as one graph), one lane
///   pipelined+graphed:  load -> encode (a graph on the encoder lane)
///                            -> train (a graph on the decoder lane)
///
/// Graphed stages warm up eagerly for kGraphWarmupSteps steps, then capture and replay
/// (GraphedStage); a short last batch runs eagerly. The frozen encoder makes pipelining exact,
/// and the graphs replay the eager kernels: every mode computes serial's losses.
class SegScenario : public Scenario {
 public:
  explicit SegScenario(const ScenarioOptions& options);
  ~SegScenario() override;

  std::string name() const override { return "seg"; }
  inline static const std::vector<std::string> kModes{"serial", "pipelined", "graphed",
                                                      "pipelined+graphed"};
  std::vector<std::string> modes() const override { return kModes; }
  std::unique_ptr<Pipeline> prepare(const std::string& mode, int64_t num_steps) override;
  std::vector<float> losses() const override;
  std::vector<std::string> notes() const override;

  torch::nn::Sequential& encoder() { return encoder_; }
  torch::nn::Sequential& decoder() { return decoder_; }

 private:
  /// (B, 3, 256, 256) uint8 -> (B, 4096, 1, 1) float features, no grad. Capture-safe.
  at::Tensor encode_features(const at::Tensor& image);
  /// One decoder training step on (B, 4096, 1, 1) features and (B, 256, 256) int64 labels;
  /// returns the loss, 0-dim float. Capture-safe (after one eager step).
  at::Tensor train_step(const at::Tensor& features, const at::Tensor& label);

  void load(Batch& batch, const Lane& lane);
  void encode(Batch& batch, const Lane& lane);
  void train(Batch& batch, const Lane& lane);
  void step_graphed(Batch& batch, const Lane& lane);
  void encode_graphed(Batch& batch, const Lane& lane);
  void train_graphed(Batch& batch, const Lane& lane);

  ScenarioOptions options_;
  torch::nn::Sequential encoder_{nullptr};
  torch::nn::Sequential decoder_{nullptr};
  std::unique_ptr<optim::Sgd> optimizer_;
  std::unique_ptr<Loader> loader_;
  at::Tensor losses_;  // (num_steps,) float32 on the device, written by the train stage

  // Graphed modes: `step_` (graphed) or `encode_` and `train_` (pipelined+graphed), rebuilt by
  // each prepare(); each is used by its stage's thread only.
  std::string mode_;
  std::unique_ptr<GraphedStage> step_, encode_, train_;
};

}  // namespace tandem
