// frozen_backbone: a workload of your own on tandem's core API (tandem::tandem). A frozen conv
// backbone is a feed stage on a lane of its own, a linear head trains with tandem's capturable
// AdamW, and the samples come from a Dataset subclass. The same workload runs serially and in
// pipelined+graphed mode (backbone on step n+1 beside the head's step n, each stage replaying a
// CUDA graph; eager on the CPU, as the runner's notes say): the losses must be bitwise identical.
//
//   frozen_backbone [--device auto|cpu|cuda] [--steps N] [--batch-size B]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tandem/runner.h"

namespace nn = torch::nn;
constexpr int64_t kClasses = 4, kImageSize = 32;

// Sample i: a label in [0, 4) and a (3, 32, 32) uint8 image whose brightness band gives the label
// away (class c: pixels in [64c, 64c + 64)). A pure function of i (its own generator): the
// loader's worker threads call get() in any order.
class BandsDataset : public tandem::Dataset {
 public:
  int64_t size() const override { return 1 << 14; }
  std::vector<tandem::FieldSpec> fields() const override {
    return {{"image", {3, kImageSize, kImageSize}, at::kByte}, {"label", {}, at::kLong}};
  }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    const int64_t label = (index * 7 + 3) % kClasses;
    out[0].random_(0, 64, at::make_generator<at::CPUGeneratorImpl>(index)).add_(label * 64);
    out[1].fill_(label);
  }
};

// A fresh instance with the same initial weights at every call: each run trains its own head.
tandem::Workload make_workload(c10::Device device) {
  torch::manual_seed(0);
  nn::Sequential backbone(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)), nn::ReLU(),
                          nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)), nn::ReLU(),
                          nn::Conv2d(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)), nn::ReLU(),
                          nn::AdaptiveAvgPool2d(1), nn::Flatten());
  nn::Linear head(64, kClasses);
  backbone->to(device);
  head->to(device);
  backbone->eval();
  for (auto& p : backbone->parameters()) p.set_requires_grad(false);

  tandem::Workload w;
  w.name = "frozen-backbone";
  w.device = device;
  w.data = tandem::DataSource::from_dataset(std::make_shared<BandsDataset>());
  // On lane "backbone", under no_grad: (B, 3, 32, 32) uint8 -> (B, 64) float32.
  auto encode = [net = backbone.ptr()](const tandem::Tensors& in) {
    return tandem::Tensors{net->forward(in[0].to(at::kFloat).div(255))};
  };
  w.feeds.push_back({"encode", "backbone", {"image"}, {"features"}, encode, "frozen backbone", {}});
  w.train.inputs = {"features", "label"};  // (B, 64) float32, (B,) int64
  w.train.loss = [net = head.ptr()](const tandem::Tensors& in) {
    // Per-sample losses, then a mean: deterministic on CUDA (nll_loss's own mean uses atomics).
    return at::cross_entropy_loss(net->forward(in[0]), in[1], {}, at::Reduction::None).mean();
  };
  w.train.optimizer = std::make_shared<tandem::optim::Adam>(
      head->parameters(), tandem::optim::AdamOptions::adamw(1e-2));
  w.train.what = "linear head, cross-entropy";
  return w;
}

int64_t positive(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  TORCH_CHECK(!value.empty() && *end == '\0' && n > 0, flag, " '", value,
              "' is not valid: expected a positive number");
  return n;
}

int main(int argc, char** argv) try {
  std::string device_name = "auto";
  int64_t steps = 0, batch_size = 0;  // 0: the device's default
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i], value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--device")
      device_name = value;
    else if (flag == "--steps")
      steps = positive(flag, value);
    else if (flag == "--batch-size")
      batch_size = positive(flag, value);
    else
      throw tandem::InvalidArgument("unknown option '" + flag +
                                    "': expected --device, --steps or --batch-size");
  }
  if (device_name != "auto" && device_name != "cpu" && device_name != "cuda")
    throw tandem::InvalidArgument("--device '" + device_name +
                                  "' is not valid: expected auto, cpu or cuda");
  const bool cuda = device_name == "cuda" || (device_name == "auto" && torch::cuda::is_available());
  if (cuda && !torch::cuda::is_available())
    throw tandem::InvalidArgument("--device cuda: no CUDA device");
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (steps == 0) steps = cuda ? 200 : 8;
  if (batch_size == 0) batch_size = cuda ? 256 : 8;
  if (cuda) at::globalContext().setDeterministicCuDNN(true);  // same conv kernels in both runs

  std::printf("frozen backbone + AdamW head on %s: %lld steps of %lld samples\n\n",
              device.str().c_str(), static_cast<long long>(steps),
              static_cast<long long>(batch_size));
  std::printf("%-18s %11s %11s\n", "mode", "first loss", "last loss");
  std::vector<float> losses[2];
  const tandem::Mode modes[2] = {tandem::Mode::kSerial, tandem::Mode::kPipelinedGraphed};
  for (int m = 0; m < 2; ++m) {
    tandem::RunOptions options;
    options.mode = modes[m];
    options.batch_size = batch_size;
    options.workers = 2;
    tandem::Runner runner(make_workload(device), options);
    losses[m] = runner.train(steps);  // every step's loss, in step order
    std::printf("%-18s %11.5f %11.5f\n", tandem::to_string(modes[m]), losses[m].front(),
                losses[m].back());
    if (m == 1)  // what the graphed mode captured, what ran eagerly and why
      for (const std::string& note : runner.notes()) std::printf("note: %s\n", note.c_str());
  }
  const bool identical =
      losses[0].size() == losses[1].size() &&
      std::memcmp(losses[0].data(), losses[1].data(), losses[0].size() * sizeof(float)) == 0;
  std::printf("identical: %s (all %zu losses, bitwise)\n", identical ? "yes" : "no",
              losses[0].size());
  return identical ? 0 : 1;
} catch (const std::exception& e) {  // tandem::Error, c10::Error: one line (no backtrace)
  std::fprintf(stderr, "frozen_backbone: error: %s\n", tandem::first_line(e.what()).c_str());
  return 1;
}
