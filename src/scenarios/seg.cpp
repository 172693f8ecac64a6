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
  loader_.reset();  // stop the previous run's workers before starting new ones
  const LoaderOptions lo = loader_options(options_);
  loader_ = std::make_unique<Loader>(
      std::make_shared<SegDataset>(num_steps * options_.batch_size, options_.seed), lo);
  losses_ = at::zeros({num_steps}, at::TensorOptions().dtype(at::kFloat).device(options_.device));

  const c10::Device dev = options_.device;
  std::vector<Stage> stages;
  stages.push_back({"load", Lane::create("copy", dev),
                    [this](Batch& b, const Lane& l) { load(b, l); }});
  stages.push_back({"encode", Lane::create("encoder", dev),
                    [this](Batch& b, const Lane& l) { encode(b, l); }});
  stages.push_back({"train", Lane::create("decoder", dev, options_.train_priority),
                    [this](Batch& b, const Lane& l) { train(b, l); }});
  const PipelineMode pm = mode == "serial" ? PipelineMode::kSerial : PipelineMode::kPipelined;
  return std::make_unique<Pipeline>(std::move(stages), pm, Lane::create("serial", dev));
}

void SegScenario::load(Batch& batch, const Lane& lane) {
  load_next_batch(*loader_, batch, lane);
}

void SegScenario::encode(Batch& batch, const Lane& lane) {
  at::NoGradGuard no_grad;
  at::Tensor x = batch.get("image").to(at::kFloat);  // (B, 3, 256, 256) float, no rescale
  batch.set("features", encoder_->forward(x));       // (B, 4096, 1, 1) float
  batch.erase("image");
}

void SegScenario::train(Batch& batch, const Lane& lane) {
  optimizer_->zero_grad();
  at::Tensor logits = decoder_->forward(batch.get("features"));  // (B, 10, 256, 256)
  at::Tensor loss = deterministic_cross_entropy(logits, batch.get("label"));
  loss.backward();
  optimizer_->step();
  losses_.select(0, batch.index).copy_(loss.detach());
}

std::vector<float> SegScenario::losses() const {
  return losses_to_host(losses_);
}

}  // namespace tandem
