// train_your_job: your own model and data trained by tandem::train's Trainer — epochs, an
// evaluation after each, metrics.jsonl / .csv, atomic checkpoints, an exact --resume, and the
// final weights as safetensors. A TrainJob is a Workload (the training step) plus the model to
// save and an evaluation; the Trainer runs it in any mode.
//
//   train_your_job --out RUN_DIR [--epochs N] [--device cpu|cuda] [--resume]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tandem/train/trainer.h"

// Sample i: 2-D point in [-1, 1]^2, label 1 inside the circle of radius 0.7 (a pure function of
// i). The first `size` indices train, the next 1024 evaluate.
class CircleDataset : public tandem::Dataset {
 public:
  CircleDataset(int64_t first, int64_t size) : first_(first), size_(size) {}
  int64_t size() const override { return size_; }
  std::vector<tandem::FieldSpec> fields() const override {
    return {{"x", {2}, at::kFloat}, {"label", {}, at::kLong}};
  }
  void get(int64_t i, const std::vector<at::Tensor>& out) const override {
    out[0].uniform_(-1, 1, at::make_generator<at::CPUGeneratorImpl>(first_ + i));
    out[1].fill_(out[0].pow(2).sum().item<float>() < 0.49f ? 1 : 0);
  }

 private:
  int64_t first_, size_;
};

int main(int argc, char** argv) {
  std::string out, device_flag = "cpu";
  int64_t epochs = 4;
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--epochs") && i + 1 < argc)
      epochs = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--device") && i + 1 < argc)
      device_flag = argv[++i];
    else if (!std::strcmp(argv[i], "--resume"))
      resume = true;
  }
  if (out.empty()) {
    std::fprintf(stderr,
                 "usage: train_your_job --out RUN_DIR [--epochs N] [--device cpu|cuda] "
                 "[--resume]\n");
    return 2;
  }
  const c10::Device device(device_flag == "cuda" ? c10::kCUDA : c10::kCPU);

  torch::manual_seed(0);
  auto model = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(2, 64), torch::nn::ReLU(), torch::nn::Linear(64, 2));
  model->to(device);

  tandem::train::TrainJob job;
  job.name = "circle";
  job.model = model;
  job.config = {{"model", "mlp 2-64-2"}, {"data", "circle"}};  // what a resume must match
  tandem::Workload& w = job.workload;
  w.name = "circle";
  w.device = device;
  w.data = tandem::DataSource::from_dataset(std::make_shared<CircleDataset>(0, 8192),
                                            /*shuffle=*/true, /*drop_last=*/true);
  w.train.inputs = {"x", "label"};
  w.train.loss = [model](const tandem::Tensors& in) {
    return tandem::deterministic_cross_entropy(model->forward(in[0]), in[1]);
  };
  w.train.optimizer = std::make_shared<tandem::optim::Adam>(model->parameters(),
                                                            tandem::optim::AdamOptions::adamw());
  // The evaluation runs on the train lane between two steps: it may synchronize.
  const auto val = std::make_shared<CircleDataset>(8192, 1024);
  job.evaluate = [model, val, device](const tandem::Lane&) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> xs, ys;
    for (int64_t i = 0; i < val->size(); ++i) {
      std::vector<at::Tensor> s{at::empty({2}), at::empty({}, at::kLong)};
      val->get(i, s);
      xs.push_back(s[0]);
      ys.push_back(s[1]);
    }
    const at::Tensor logits = model->forward(at::stack(xs).to(device));
    const double acc =
        logits.argmax(1).cpu().eq(at::stack(ys)).to(at::kDouble).mean().item<double>();
    return tandem::train::Metrics{{"accuracy", acc}};
  };

  tandem::train::TrainOptions o;
  o.epochs = epochs;
  o.batch_size = 128;
  o.mode = device.is_cuda() ? tandem::Mode::kPipelinedGraphed : tandem::Mode::kPipelined;
  o.workers = 2;
  o.schedule = tandem::optim::cosine(1e-2, epochs * (8192 / 128));
  o.out_dir = out;
  o.resume = resume;
  o.on_epoch = [](const tandem::train::EpochRecord& r) {
    std::printf("epoch %lld  train_loss %.4f  accuracy %.2f%%  %.0f samples/s\n",
                static_cast<long long>(r.epoch), r.train_loss, 100 * r.metrics.at("accuracy"),
                r.images_per_s);
  };
  tandem::train::Trainer trainer(job, o);
  const tandem::train::TrainResult result = trainer.run();
  std::printf("weights %s (checkpoint %s)\n", result.weights.c_str(),
              result.last_checkpoint.c_str());
  const double acc = result.epochs.back().metrics.at("accuracy");
  return acc > 0.9 ? 0 : 1;  // the circle is learnable: a run that does not learn fails
}
