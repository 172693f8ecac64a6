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
  const int64_t samples = run_samples(options_, num_steps);
  // The previous run's graphs go first: they hold the previous generator's state.
  step_.reset();
  augment_.reset();
  train_.reset();
  loader_.reset();
  const c10::Device dev = options_.device;
  // The augmentation parameters of a run are drawn from a generator seeded per run, in step
  // order: gpu_aug, pipelined and the graphed modes draw the same parameters for the same step.
  generator_ = dev.is_cuda() ? at::cuda::detail::createCUDAGenerator(dev.index())
                             : at::make_generator<at::CPUGeneratorImpl>();
  generator_.set_current_seed(options_.seed);
  auto source = std::make_shared<ClsDataset>(samples, options_.seed, cls_.learnable);
  const LoaderOptions lo = loader_options(options_);
  std::shared_ptr<const Dataset> data = source;
  if (mode == "cpu_aug") data = std::make_shared<AugmentedDataset>(source, cls_.augment, options_.seed);
  loader_ = std::make_unique<Loader>(data, lo);
  losses_ = at::zeros({num_steps}, at::TensorOptions().dtype(at::kFloat).device(dev));
  mode_ = mode;

  std::vector<Stage> stages;
  stages.push_back({"load", Lane::create("copy", dev),
                    [this](Batch& b, const Lane& l) { load_next_batch(*loader_, b, l); }});
  using Inputs = std::vector<at::Tensor>;
  // Only the graph that draws the parameters registers the generator: registering it with the
  // train graph too would mark it "capturing" while the augment thread draws from it.
  // The graphed stages of a run share one warm-up barrier: none captures while another may
  // still autotune cuDNN in its eager first steps (see WarmupBarrier).
  auto barrier = std::make_shared<WarmupBarrier>();
  auto graph_options = [this](const char* name, bool draws) {
    GraphOptions o;
    o.name = name;
    if (draws && generator_.device().is_cuda()) o.generators = {generator_};
    return o;
  };
  if (mode == "graphed") {
    step_ = std::make_unique<GraphedStage>(
        graph_options("cls step", true),
        [this](const Inputs& in) { return Inputs{train_step(augment_images(in[0]), in[1])}; },
        GraphOutputs::kStatic, barrier);
    stages.push_back({"step", Lane::create("train", dev),
                      [this](Batch& b, const Lane& l) { step_graphed(b, l); }});
  } else if (mode == "pipelined+graphed") {
    // Private pools (the graphs replay concurrently) and cloned augment outputs (its next replay
    // rewrites them while the train lane may still read them), as seg's pipelined+graphed. The
    // clone is one device copy of the batch (25 MB at batch 32, microseconds on an H200) and
    // holds no more memory than pipelined mode's fresh output per batch; per-ring-slot statics
    // would need one graph per slot.
    augment_ = std::make_unique<GraphedStage>(
        graph_options("cls augment", true),
        [this](const Inputs& in) { return Inputs{augment_images(in[0])}; },
        GraphOutputs::kCloned, barrier);
    train_ = std::make_unique<GraphedStage>(
        graph_options("cls train", false),
        [this](const Inputs& in) { return Inputs{train_step(in[0], in[1])}; },
        GraphOutputs::kStatic, barrier);
    stages.push_back({"augment", Lane::create("augment", dev),
                      [this](Batch& b, const Lane& l) { augment_graphed(b, l); }});
    stages.push_back({"train", Lane::create("train", dev, options_.train_priority),
                      [this](Batch& b, const Lane& l) { train_graphed(b, l); }});
  } else {
    if (mode != "cpu_aug")
      stages.push_back({"augment", Lane::create("augment", dev),
                        [this](Batch& b, const Lane& l) { augment_stage(b, l); }});
    stages.push_back({"train", Lane::create("train", dev, options_.train_priority),
                      [this](Batch& b, const Lane& l) { train(b, l); }});
  }
  const PipelineMode pm = mode == "pipelined" || mode == "pipelined+graphed"
                              ? PipelineMode::kPipelined
                              : PipelineMode::kSerial;
  return std::make_unique<Pipeline>(std::move(stages), pm, Lane::create("serial", dev));
}

at::Tensor ClsScenario::augment_images(const at::Tensor& images) {
  const AugmentParams p = draw_augment_params(cls_.augment, images.size(0), images.size(2),
                                              images.size(3), images.device(), generator_);
  return augment(images, p, cls_.augment);
}

at::Tensor ClsScenario::train_step(const at::Tensor& images, const at::Tensor& labels) {
  optimizer_->zero_grad();  // host-only: backward writes fresh gradients (see GraphedStep)
  const at::Tensor logits = model_->forward(images);  // (B, 10)
  at::Tensor loss = deterministic_cross_entropy(logits, labels);
  loss.backward();
  optimizer_->step();
  return loss.detach();
}

void ClsScenario::augment_stage(Batch& batch, const Lane& lane) {
  // (B, 3, 256, 256) uint8 in, (B, 3, 256, 256) float32 out
  batch.set("image", augment_images(batch.get("image")));
}

void ClsScenario::train(Batch& batch, const Lane& lane) {
  // (B, 3, 256, 256) float32: augmented by the loader's workers (cpu_aug) or the augment stage.
  const at::Tensor loss = train_step(batch.get("image"), batch.get("label"));
  losses_.select(0, batch.index).copy_(loss);
}

// As seg's: copy inputs into the statics, replay on the lane, copy the loss out on the lane
// before the next replay rewrites it.
void ClsScenario::step_graphed(Batch& batch, const Lane& lane) {
  const at::Tensor loss =
      step_->run(lane, batch.index, {batch.get("image"), batch.get("label")})[0];
  losses_.select(0, batch.index).copy_(loss);
}

void ClsScenario::augment_graphed(Batch& batch, const Lane& lane) {
  batch.set("image", augment_->run(lane, batch.index, {batch.get("image")})[0]);
}

void ClsScenario::train_graphed(Batch& batch, const Lane& lane) {
  const at::Tensor loss =
      train_->run(lane, batch.index, {batch.get("image"), batch.get("label")})[0];
  losses_.select(0, batch.index).copy_(loss);
}

std::vector<float> ClsScenario::losses() const {
  return losses_to_host(losses_);
}

std::vector<std::string> ClsScenario::notes() const {
  std::vector<std::string> out;
  if (mode_ != "graphed" && mode_ != "pipelined+graphed") return out;
  if (!options_.device.is_cuda()) return {cpu_graph_note(mode_)};
  if (step_ && step_->captured())
    out.push_back(detail::concat(
        "captured: step (augmentation parameters drawn from the run's generator, the fused "
        "augment kernel, forward, loss, backward, SGD) as one graph after ",
        step_->warmup_steps(), " eager warm-up steps on a side lane; ", step_->replays(),
        " replays, each drawing new parameters; load (loader and H2D copy) stays eager"));
  if (augment_ && train_ && (augment_->captured() || train_->captured()))
    out.push_back(detail::concat(
        "captured: augment (parameters drawn from the run's generator, fused kernel) and train "
        "(forward, loss, backward, SGD) as one graph each, replayed on its own lane, after ",
        train_->warmup_steps(), " eager warm-up steps on a side lane; ", augment_->replays(),
        " and ", train_->replays(), " replays; load (loader and H2D copy) stays eager"));
  for (const GraphedStage* g : {step_.get(), augment_.get(), train_.get()})
    if (g)
      for (auto& note : g->notes()) out.push_back(note);
  return out;
}

}  // namespace tandem
