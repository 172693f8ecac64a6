// Workload "mlp": the model, and its step run eagerly or as replays of a captured graph.
#include "tandem/scenarios/mlp.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "tandem/error.h"
#include "tandem/loss_log.h"

namespace tandem {

namespace nn = torch::nn;

torch::nn::Sequential make_mlp_model() {
  return nn::Sequential(nn::Linear(kMlpIn, kMlpHidden), nn::Dropout(0.2),
                        nn::Linear(kMlpHidden, kMlpOut), nn::Dropout(0.1));
}

MlpScenario::MlpScenario(const ScenarioOptions& options) : options_(options) {
  TANDEM_CHECK_ARG(options.batch_size > 0, "batch size ", options.batch_size,
                   " is not valid: expected a positive number of rows");
  TANDEM_CHECK_ARG(options.last_batch_size == 0, "last batch size ", options.last_batch_size,
                   " is not valid for scenario mlp: its batches are device tensors of one size, "
                   "expected 0");
  torch::manual_seed(options.seed);
  model_ = make_mlp_model();
  model_->to(options.device);
  model_->train();
  optimizer_ = std::make_unique<optim::Sgd>(model_->parameters(), kMlpLearningRate);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device);
  for (int i = 0; i < kMlpDistinctBatches; ++i) {  // GPU-resident data, as the reference's
    inputs_.push_back(at::randn({options.batch_size, kMlpIn}, f32));
    targets_.push_back(at::randn({options.batch_size, kMlpOut}, f32));
  }
}

MlpScenario::~MlpScenario() = default;

std::unique_ptr<Pipeline> MlpScenario::prepare(const std::string& mode, int64_t num_steps) {
  check_prepare("mlp", kModes, mode, num_steps);
  const c10::Device dev = options_.device;
  graph_.reset();  // before the log their replays append to
  staged_graphs_.clear();
  loss_log_ = std::make_unique<LossLog>(num_steps, dev);
  num_steps_ = num_steps;
  replays_ = eager_tail_ = 0;
  capture_note_.clear();
  const bool graphed = mode != "eager" && dev.is_cuda();
  if (mode != "eager" && !dev.is_cuda())
    capture_note_ = cpu_graph_note(mode);
  steps_per_graph_ = mode == "graphed_k" ? kMlpStepsPerGraph : 1;
  if (mode == "pipelined+graphed" && dev.is_cuda()) {
    std::vector<Stage> stages{
        {"stage", Lane::create("copy", dev),
         [this](Batch& b, const Lane& l) { stage_inputs(b, l); }},
        {"train", Lane::create("train", dev),
         [this](Batch& b, const Lane& l) { replay_staged(b, l); }}};
    auto pipeline = std::make_unique<Pipeline>(std::move(stages), PipelineMode::kPipelined,
                                               Lane::create("train", dev));
    const int64_t slots = pipeline->depth() + 1;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
    static_x_ = at::zeros({slots, options_.batch_size, kMlpIn}, f32);
    static_y_ = at::zeros({slots, options_.batch_size, kMlpOut}, f32);
    staging_x_.clear();
    staging_y_.clear();
    for (int64_t s = 0; s < slots; ++s) {
      staging_x_.push_back(static_x_[s].variable_data());
      staging_y_.push_back(static_y_[s].variable_data());
    }
    return pipeline;
  }
  std::vector<Stage> stages;
  if (graphed) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
    static_x_ = at::zeros({steps_per_graph_, options_.batch_size, kMlpIn}, f32);
    static_y_ = at::zeros({steps_per_graph_, options_.batch_size, kMlpOut}, f32);
    stages.push_back({"train", Lane::create("train", dev),
                      [this](Batch& b, const Lane& l) { train_graphed(b, l); }});
  } else {
    stages.push_back({"train", Lane::create("train", dev),
                      [this](Batch& b, const Lane& l) { train_eager(b, l); }});
  }
  return std::make_unique<Pipeline>(std::move(stages), PipelineMode::kSerial,
                                    Lane::create("train", dev));
}

void MlpScenario::enqueue_step(const at::Tensor& x, const at::Tensor& y) {
  optimizer_->zero_grad();  // host-only: backward then writes fresh gradients
  at::Tensor loss = at::mse_loss(model_->forward(x), y);
  loss.backward();
  optimizer_->step();
  loss_log_->record(loss.detach());
}

void MlpScenario::train_eager(Batch& batch, const Lane& lane) {
  const int64_t i = batch.index;
  enqueue_step(input(i), target(i));
}

// Steps 0..warmup-1 run eagerly on a side lane (they are real steps: their losses count); the
// capture at step `warmup` records K steps without running them; from then on each group of K
// steps is staged into the K static slots and replayed once. A final group shorter than K runs
// eagerly (the graph's shapes and step count are fixed). Every step appends its loss to the log
// in step order: warm-up and tail steps eagerly, graphed steps by the appends each replay runs.
void MlpScenario::train_graphed(Batch& batch, const Lane& lane) {
  const int64_t i = batch.index;
  const int K = steps_per_graph_;
  const at::Tensor& x = input(i);
  const at::Tensor& y = target(i);
  const int64_t graphed_until = kMlpGraphWarmup + (num_steps_ - kMlpGraphWarmup) / K * K;
  if (i < kMlpGraphWarmup || i >= graphed_until) {
    if (i < kMlpGraphWarmup) {
      warm_up_on_side_lane(lane, 1, [&](int) { enqueue_step(x, y); });
    } else {
      enqueue_step(x, y);
      ++eager_tail_;
    }
    return;
  }
  if (!graph_) {
    GraphOptions go;
    go.name = "mlp train";
    go.static_tensors = {static_x_, static_y_};
    graph_ = std::make_unique<GraphedStep>(go);
    optimizer_->zero_grad();
    graph_->capture(lane, [&] {
      for (int k = 0; k < K; ++k) enqueue_step(static_x_[k], static_y_[k]);
    });
  }
  const int slot = static_cast<int>((i - kMlpGraphWarmup) % K);
  at::Tensor sx = static_x_[slot], sy = static_y_[slot];
  copy_into_static(sx, x);
  copy_into_static(sy, y);
  if (slot == K - 1) {
    graph_->replay(lane);
    ++replays_;
  }
}

// The copy lane writes item i's batch into the static inputs of its ring slot while the train
// lane replays the step before it; the pipeline's handoff orders the replay after the copy, and
// its ring orders the copy after the last replay that read those inputs. Warm-up items train on
// their batches directly (nothing to stage). The copy goes through an alias with its own version
// counter: a write through the static tensor itself would bump the counter that the capture on
// the train thread, at the same time, records with the input it saves for backward — and the
// capture's backward would then refuse the input as "modified by an inplace operation" (it did,
// in a GPU test). The counter guards eager autograd; here the events order the bytes.
void MlpScenario::stage_inputs(Batch& batch, const Lane&) {
  const int64_t i = batch.index;
  if (i < kMlpGraphWarmup) return;
  copy_into_static(staging_x_.at(batch.ring_slot), input(i));
  copy_into_static(staging_y_.at(batch.ring_slot), target(i));
}

// At the first item after warm-up, one graph per ring slot is captured (nothing runs); the
// graphs replay in the order they were captured — slot 0, 1, 2, 0, ... on one lane — so they
// share the first one's pool. Every replay appends its loss to the log, in step order.
void MlpScenario::replay_staged(Batch& batch, const Lane& lane) {
  const int64_t i = batch.index;
  if (i < kMlpGraphWarmup) {
    warm_up_on_side_lane(lane, 1, [&](int) { enqueue_step(input(i), target(i)); });
    return;
  }
  if (staged_graphs_.empty()) {
    for (int64_t s = 0; s < static_x_.size(0); ++s) {
      GraphOptions go;
      go.name = detail::concat("mlp train (static inputs ", s, ")");
      go.static_tensors = {static_x_[s], static_y_[s]};
      if (s > 0) go.pool = staged_graphs_.front()->pool();
      auto graph = std::make_unique<GraphedStep>(go);
      optimizer_->zero_grad();
      graph->capture(lane, [&] { enqueue_step(static_x_[s], static_y_[s]); });
      staged_graphs_.push_back(std::move(graph));
    }
  }
  TORCH_INTERNAL_ASSERT(batch.ring_slot >= 0 &&
                        batch.ring_slot < static_cast<int>(staged_graphs_.size()));
  staged_graphs_[batch.ring_slot]->replay(lane);
  ++replays_;
}

std::vector<float> MlpScenario::losses() const {
  return loss_log_ ? loss_log_->values() : std::vector<float>{};
}

std::vector<std::string> MlpScenario::notes() const {
  std::vector<std::string> out;
  if (!capture_note_.empty()) out.push_back(capture_note_);
  if (!staged_graphs_.empty())
    out.push_back(detail::concat(
        "captured: ", staged_graphs_.size(),
        " graphs of one whole training step each, one per set of static inputs (sharing one "
        "pool), after ", kMlpGraphWarmup, " eager warm-up steps on a side lane; the copy lane "
        "stages each batch into the next set while the train lane replays; ", replays_,
        " replays"));
  if (graph_ && graph_->captured())
    out.push_back(detail::concat("captured: ", steps_per_graph_,
                                 " whole training step(s) (forward, MSE, backward, SGD, loss "
                                 "appended to the device log) per graph after ", kMlpGraphWarmup,
                                 " eager warm-up steps on a side lane; ", replays_,
                                 " replays"));
  if (eager_tail_ > 0)
    out.push_back(detail::concat("the last ", eager_tail_, " step(s) ran eagerly: fewer than ",
                                 steps_per_graph_, " were left for a replay"));
  return out;
}

}  // namespace tandem
