// Workload "cls": model, datasets, and the stages of its three modes.
#include "tandem/scenarios/cls.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "tandem/error.h"
#include "tandem/sample_rng.h"
#include "tandem/scenarios/seg.h"

namespace tandem {

namespace nn = torch::nn;

torch::nn::Sequential make_cls_model() {
  nn::Sequential seq = make_seg_encoder();  // SPEC: the same 9-conv stack
  seq->push_back(nn::Flatten());
  seq->push_back(nn::Linear(4096, kClsClasses));
  return seq;
}

ClsDataset::ClsDataset(int64_t size, uint64_t seed, bool learnable, int64_t image_size,
                       int64_t classes)
    : size_(size), seed_(seed), learnable_(learnable), image_size_(image_size), classes_(classes) {
  TANDEM_CHECK_ARG(size >= 0, "dataset size ", size, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(classes > 0 && classes <= 256, "class count ", classes,
                   " is not valid: expected 1..256");
}

std::vector<FieldSpec> ClsDataset::fields() const {
  return {{"image", {3, image_size_, image_size_}, at::kByte}, {"label", {}, at::kLong}};
}

void ClsDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TORCH_CHECK(index >= 0 && index < size_, "sample index ", index, " is outside [0, ", size_, ")");
  SampleRng rng(seed_, static_cast<uint64_t>(index));
  int64_t label;
  rng.fill_below(&label, 1, static_cast<uint32_t>(learnable_ ? 2 : classes_));
  uint8_t* image = static_cast<uint8_t*>(out.at(0).data_ptr());
  const int64_t n = out[0].numel();
  rng.fill_bytes(image, n);
  if (learnable_)  // class 0: dark pixels in [0, 64); class 1: bright ones in [192, 256)
    for (int64_t i = 0; i < n; ++i) image[i] = static_cast<uint8_t>(label * 192 + image[i] % 64);
  *out.at(1).data_ptr<int64_t>() = label;
}

AugmentedDataset::AugmentedDataset(std::shared_ptr<const Dataset> source, AugmentSpec spec,
                                   uint64_t seed)
    : source_(std::move(source)), spec_(std::move(spec)), seed_(seed) {
  source_fields_ = source_->fields();
  TORCH_CHECK(!source_fields_.empty() && source_fields_[0].dtype == at::kByte &&
                  source_fields_[0].shape.size() == 3,
              "AugmentedDataset needs a source whose first field is a (C, H, W) uint8 image");
  const auto& s = source_fields_[0].shape;
  spec_.validate(s[0], s[1], s[2]);
}

std::vector<FieldSpec> AugmentedDataset::fields() const {
  std::vector<FieldSpec> f = source_fields_;
  f[0].shape = {f[0].shape[0], spec_.out_h, spec_.out_w};
  f[0].dtype = at::kFloat;
  return f;
}

void AugmentedDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  // The raw image goes to a per-thread buffer; the other fields straight to the slot.
  std::vector<at::Tensor> raw = out;
  raw[0] = at::empty(source_fields_[0].shape, at::kByte);
  source_->get(index, raw);
  const auto& s = source_fields_[0].shape;
  const AugmentParams p = draw_augment_params_host(spec_, s[1], s[2], seed_, index);
  at::Tensor image = out[0];
  augment_sample_cpu(raw[0], p, 0, spec_, image);
}

ClsScenario::ClsScenario(const ScenarioOptions& options, ClsOptions cls)
    : options_(options), cls_(std::move(cls)) {
  TANDEM_CHECK_ARG(options.batch_size > 0, "batch size ", options.batch_size,
                   " is not valid: expected a positive number of samples");
  cls_.augment.validate(3, kClsImageSize, kClsImageSize);
  torch::manual_seed(options.seed);
  model_ = make_cls_model();
  model_->to(options.device);
  model_->train();
  optimizer_ = std::make_unique<optim::Sgd>(model_->parameters(), cls_.lr);
}

ClsScenario::~ClsScenario() = default;

std::unique_ptr<Pipeline> ClsScenario::prepare(const std::string& mode, int64_t num_steps) {
  check_prepare("cls", kModes, mode, num_steps);
  loader_.reset();
  const c10::Device dev = options_.device;
  // The augmentation parameters of a run are drawn from a generator seeded per run, in step
  // order: gpu_aug and pipelined draw the same parameters for the same step.
  generator_ = dev.is_cuda() ? at::cuda::detail::createCUDAGenerator(dev.index())
                             : at::make_generator<at::CPUGeneratorImpl>();
  generator_.set_current_seed(options_.seed);
  auto source = std::make_shared<ClsDataset>(num_steps * options_.batch_size, options_.seed,
                                             cls_.learnable);
  const LoaderOptions lo = loader_options(options_);
  std::shared_ptr<const Dataset> data = source;
  if (mode == "cpu_aug") data = std::make_shared<AugmentedDataset>(source, cls_.augment, options_.seed);
  loader_ = std::make_unique<Loader>(data, lo);
  losses_ = at::zeros({num_steps}, at::TensorOptions().dtype(at::kFloat).device(dev));

  std::vector<Stage> stages;
  stages.push_back({"load", Lane::create("copy", dev),
                    [this](Batch& b, const Lane& l) { load_next_batch(*loader_, b, l); }});
  if (mode != "cpu_aug")
    stages.push_back({"augment", Lane::create("augment", dev),
                      [this](Batch& b, const Lane& l) { augment_stage(b, l); }});
  stages.push_back({"train", Lane::create("train", dev, options_.train_priority),
                    [this](Batch& b, const Lane& l) { train(b, l); }});
  const PipelineMode pm = mode == "pipelined" ? PipelineMode::kPipelined : PipelineMode::kSerial;
  return std::make_unique<Pipeline>(std::move(stages), pm, Lane::create("serial", dev));
}

void ClsScenario::augment_stage(Batch& batch, const Lane& lane) {
  const at::Tensor& images = batch.get("image");  // (B, 3, 256, 256) uint8
  const AugmentParams p = draw_augment_params(cls_.augment, images.size(0), images.size(2),
                                              images.size(3), images.device(), generator_);
  batch.set("image", augment(images, p, cls_.augment));  // (B, 3, 256, 256) float32
}

void ClsScenario::train(Batch& batch, const Lane& lane) {
  optimizer_->zero_grad();
  // (B, 3, 256, 256) float32: augmented by the loader's workers (cpu_aug) or the augment stage.
  const at::Tensor logits = model_->forward(batch.get("image"));  // (B, 10)
  at::Tensor loss = deterministic_cross_entropy(logits, batch.get("label"));
  loss.backward();
  optimizer_->step();
  losses_.select(0, batch.index).copy_(loss.detach());
}

std::vector<float> ClsScenario::losses() const {
  return losses_to_host(losses_);
}

}  // namespace tandem
