// Workload "mlp" (SPEC.md): Linear(4096->2048), Dropout(0.2), Linear(2048->1024), Dropout(0.1),
// MSE, SGD lr 0.1 — a launch-bound step. Modes: eager (every kernel launched each step),
// graphed (the whole step captured once, replayed per step), graphed_k (K steps per graph),
// pipelined+graphed (a copy lane stages batch n+1 into its own static inputs while the train
// lane replays step n: one graph per set of static inputs, sharing one memory pool).
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <optional>

#include "tandem/graph.h"
#include "tandem/optim.h"
#include "tandem/scenario.h"

namespace tandem {

class LossLog;

constexpr int64_t kMlpIn = 4096, kMlpHidden = 2048, kMlpOut = 1024;
constexpr double kMlpLearningRate = 0.1;
constexpr int kMlpGraphWarmup = 3;    ///< eager steps on a side lane before capture
constexpr int kMlpStepsPerGraph = 4;  ///< K of graphed_k
constexpr int kMlpDistinctBatches = 8;  ///< the run cycles through this many device batches

torch::nn::Sequential make_mlp_model();

class MlpScenario : public Scenario {
 public:
  explicit MlpScenario(const ScenarioOptions& options);
  ~MlpScenario() override;

  std::string name() const override { return "mlp"; }
  inline static const std::vector<std::string> kModes{"eager", "graphed", "graphed_k",
                                                      "pipelined+graphed"};
  std::vector<std::string> modes() const override { return kModes; }
  std::unique_ptr<Pipeline> prepare(const std::string& mode, int64_t num_steps) override;
  std::vector<float> losses() const override;
  std::vector<std::string> notes() const override;

  torch::nn::Sequential& model() { return model_; }

 private:
  /// Enqueues one training step on the current stream and appends its loss to the log
  /// (capture-safe: a captured step appends on every replay).
  void enqueue_step(const at::Tensor& x, const at::Tensor& y);
  void train_eager(Batch& batch, const Lane& lane);
  void train_graphed(Batch& batch, const Lane& lane);
  // pipelined+graphed: stage_inputs on the copy lane, replay_staged on the train lane.
  void stage_inputs(Batch& batch, const Lane& lane);
  void replay_staged(Batch& batch, const Lane& lane);

  ScenarioOptions options_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<optim::Sgd> optimizer_;
  std::vector<at::Tensor> inputs_, targets_;  // kMlpDistinctBatches of (B, 4096) / (B, 1024)
  // Step i's batch: the run cycles through the device batches.
  const at::Tensor& input(int64_t i) const { return inputs_[i % kMlpDistinctBatches]; }
  const at::Tensor& target(int64_t i) const { return targets_[i % kMlpDistinctBatches]; }
  std::unique_ptr<LossLog> loss_log_;         // num_steps entries, appended in step order

  // Graphed modes.
  int steps_per_graph_ = 1;
  int64_t num_steps_ = 0;
  std::unique_ptr<GraphedStep> graph_;
  at::Tensor static_x_, static_y_;  // (K, B, 4096), (K, B, 1024) float32; (slots, ...) staged
  // pipelined+graphed: graph s replays one step on static_x_[s], static_y_[s], s = ring slot;
  // the copy lane writes them through aliases with version counters of their own (see
  // stage_inputs).
  std::vector<std::unique_ptr<GraphedStep>> staged_graphs_;
  std::vector<at::Tensor> staging_x_, staging_y_;
  int64_t replays_ = 0, eager_tail_ = 0;
  std::string capture_note_;
};

}  // namespace tandem
