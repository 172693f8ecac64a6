// Workload "seg": models, synthetic dataset and the three stages (load, encode, train).
#include "tandem/scenarios/seg.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/utils.h>

#include <cstring>

#include "tandem/error.h"
#include "tandem/sample_rng.h"

namespace tandem {

namespace nn = torch::nn;

torch::nn::Sequential make_seg_encoder() {
  nn::Sequential seq;
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(3, 16, 1)));
  seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  int64_t c = 16;
  for (int i = 0; i < 8; ++i, c *= 2) {
    seq->push_back(nn::Conv2d(nn::Conv2dOptions(c, c * 2, 2).stride(2)));
    if (i < 7) seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  return seq;
}

torch::nn::Sequential make_seg_decoder() {
  nn::Sequential seq;
  int64_t c = 4096;
  for (int i = 0; i < 8; ++i, c /= 2) {
    seq->push_back(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(c, c / 2, 2).stride(2)));
    seq->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(16, kSegClasses, 3).padding(1)));
  return seq;
}

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

SegScenario::SegScenario(const ScenarioOptions& options) : options_(options) {
  TANDEM_CHECK_ARG(options.batch_size > 0, "batch size ", options.batch_size,
                   " is not valid: expected a positive number of samples");
  torch::manual_seed(options.seed);
  encoder_ = make_seg_encoder();
  decoder_ = make_seg_decoder();
  encoder_->to(options.device);
  decoder_->to(options.device);
  encoder_->eval();
  for (auto& p : encoder_->parameters()) p.set_requires_grad(false);
  decoder_->train();
  optimizer_ = std::make_unique<optim::Sgd>(decoder_->parameters(), kSegLearningRate);
}

SegScenario::~SegScenario() = default;

std::unique_ptr<Pipeline> SegScenario::prepare(const std::string& mode, int64_t num_steps) {
  check_prepare("seg", kModes, mode, num_steps);
  const int64_t samples = run_samples(options_, num_steps);
  // Drop the previous run's graphs. Safe with replays still in flight: CUDA frees an executable
  // graph once its launches complete, and the statics' memory is reused only in stream order.
  step_.reset();
  encode_.reset();
  train_.reset();
  loader_.reset();  // stop the previous run's workers before starting new ones
  const LoaderOptions lo = loader_options(options_);
  loader_ = std::make_unique<Loader>(std::make_shared<SegDataset>(samples, options_.seed), lo);
  losses_ = at::zeros({num_steps}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  mode_ = mode;

  const c10::Device dev = options_.device;
  std::vector<Stage> stages;
  stages.push_back({"load", Lane::create("copy", dev),
                    [this](Batch& b, const Lane& l) { load(b, l); }});
  using Inputs = std::vector<at::Tensor>;
  // The graphed stages of a run share one warm-up barrier: none captures while another may
  // still autotune cuDNN in its eager first steps (see WarmupBarrier).
  auto barrier = std::make_shared<WarmupBarrier>();
  auto graph_options = [](const char* name) {
    GraphOptions o;
    o.name = name;
    return o;
  };
  if (mode == "graphed") {
    // Everything after the load in one graph: one launch per step instead of hundreds.
    step_ = std::make_unique<GraphedStage>(
        graph_options("seg step"),
        [this](const Inputs& in) { return Inputs{train_step(encode_features(in[0]), in[1])}; },
        GraphOutputs::kStatic, barrier);
    stages.push_back({"step", Lane::create("train", dev),
                      [this](Batch& b, const Lane& l) { step_graphed(b, l); }});
  } else if (mode == "pipelined+graphed") {
    // One graph per stage, each with a private memory pool: the two replay concurrently on
    // their lanes, so a shared pool would let their intermediates alias. The encoder's
    // features are cloned after each replay (GraphOutputs::kCloned): its next replay rewrites
    // them while the decoder lane may still read the previous ones. They are (B, 4096) floats,
    // so the clone is one tiny copy; the Handoff then guards the clone like any stage output.
    encode_ = std::make_unique<GraphedStage>(
        graph_options("seg encode"),
        [this](const Inputs& in) { return Inputs{encode_features(in[0])}; },
        GraphOutputs::kCloned, barrier);
    train_ = std::make_unique<GraphedStage>(
        graph_options("seg train"),
        [this](const Inputs& in) { return Inputs{train_step(in[0], in[1])}; },
        GraphOutputs::kStatic, barrier);
    stages.push_back({"encode", Lane::create("encoder", dev),
                      [this](Batch& b, const Lane& l) { encode_graphed(b, l); }});
    stages.push_back({"train", Lane::create("decoder", dev, options_.train_priority),
                      [this](Batch& b, const Lane& l) { train_graphed(b, l); }});
  } else {
    stages.push_back({"encode", Lane::create("encoder", dev),
                      [this](Batch& b, const Lane& l) { encode(b, l); }});
    stages.push_back({"train", Lane::create("decoder", dev, options_.train_priority),
                      [this](Batch& b, const Lane& l) { train(b, l); }});
  }
  const PipelineMode pm = mode == "serial" || mode == "graphed" ? PipelineMode::kSerial
                                                                : PipelineMode::kPipelined;
  return std::make_unique<Pipeline>(std::move(stages), pm, Lane::create("serial", dev));
}

void SegScenario::load(Batch& batch, const Lane& lane) {
  load_next_batch(*loader_, batch, lane);
}

at::Tensor SegScenario::encode_features(const at::Tensor& image) {
  at::NoGradGuard no_grad;
  return encoder_->forward(image.to(at::kFloat));  // no rescale, as SPEC's reference
}

at::Tensor SegScenario::train_step(const at::Tensor& features, const at::Tensor& label) {
  optimizer_->zero_grad();  // host-only: backward writes fresh gradients (see GraphedStep)
  at::Tensor logits = decoder_->forward(features);  // (B, 10, 256, 256)
  at::Tensor loss = deterministic_cross_entropy(logits, label);
  loss.backward();
  optimizer_->step();
  return loss.detach();
}

void SegScenario::encode(Batch& batch, const Lane& lane) {
  batch.set("features", encode_features(batch.get("image")));  // (B, 4096, 1, 1) float
  batch.erase("image");
}

void SegScenario::train(Batch& batch, const Lane& lane) {
  const at::Tensor loss = train_step(batch.get("features"), batch.get("label"));
  losses_.select(0, batch.index).copy_(loss);
}

// The graphed stages copy their inputs into the graph's statics, replay on their lane and copy
// the loss out on that lane, before the next replay can rewrite it (GraphOutputs::kStatic).
void SegScenario::step_graphed(Batch& batch, const Lane& lane) {
  const at::Tensor loss =
      step_->run(lane, batch.index, {batch.get("image"), batch.get("label")})[0];
  losses_.select(0, batch.index).copy_(loss);
}

void SegScenario::encode_graphed(Batch& batch, const Lane& lane) {
  batch.set("features", encode_->run(lane, batch.index, {batch.get("image")})[0]);
  batch.erase("image");
}

void SegScenario::train_graphed(Batch& batch, const Lane& lane) {
  const at::Tensor loss =
      train_->run(lane, batch.index, {batch.get("features"), batch.get("label")})[0];
  losses_.select(0, batch.index).copy_(loss);
}

std::vector<float> SegScenario::losses() const {
  return losses_to_host(losses_);
}

std::vector<std::string> SegScenario::notes() const {
  std::vector<std::string> out;
  if (mode_ != "graphed" && mode_ != "pipelined+graphed") return out;
  if (!options_.device.is_cuda()) return {cpu_graph_note(mode_)};
  if (step_ && step_->captured())
    out.push_back(detail::concat(
        "captured: step (uint8->float, frozen encoder, decoder forward, loss, backward, SGD) as "
        "one graph after ", step_->warmup_steps(), " eager warm-up steps on a side lane; ",
        step_->replays(), " replays; load (loader and H2D copy) stays eager"));
  if (encode_ && train_ && (encode_->captured() || train_->captured()))
    out.push_back(detail::concat(
        "captured: encode (uint8->float, frozen encoder) and train (decoder forward, loss, "
        "backward, SGD) as one graph each, replayed on its own lane, after ",
        train_->warmup_steps(), " eager warm-up steps on a side lane; ", encode_->replays(),
        " and ", train_->replays(), " replays; load (loader and H2D copy) stays eager"));
  for (const GraphedStage* g : {step_.get(), encode_.get(), train_.get()})
    if (g)
      for (auto& note : g->notes()) out.push_back(note);
  return out;
}

}  // namespace tandem
