// augmented_classifier: a workload of your own handed to the run layer and the front ends that
// the CLI uses (tandem::run). A small CNN trains on images that tandem's
// augmentation stage crops, flips and normalizes on a lane of its own (one fused kernel on a
// GPU). The workload is a WorkloadEntry, a factory the front ends call for a fresh instance per
// run: bench (--mode MODE), auto's trials (--mode auto), a sweep (--sweep: MODE at batch B and 2B
// beside serial), a trace (--trace FILE).
//
//   augmented_classifier [--device auto|cpu|cuda] [--steps N] [--batch-size B] [--mode MODE|auto]
//                        [--trace FILE] [--sweep]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "tandem/augment.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/run/sweep.h"

namespace nn = torch::nn;
constexpr int64_t kClasses = 10, kSourceSize = 40, kImageSize = 32;

// Sample i: label i % 10 and a (3, 40, 40) uint8 image of noise in a band that gives the label
// away. A pure function of i (its own generator): the loader's workers call get() in any order.
class BandsDataset : public tandem::Dataset {
 public:
  int64_t size() const override { return 1 << 14; }
  std::vector<tandem::FieldSpec> fields() const override {
    return {{"image", {3, kSourceSize, kSourceSize}, at::kByte}, {"label", {}, at::kLong}};
  }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    const int64_t label = index % kClasses;
    out[0].random_(0, 25, at::make_generator<at::CPUGeneratorImpl>(index)).add_(label * 25);
    out[1].fill_(label);
  }
};

// The factory: a fresh model, generator and data source; everything random derives from o.seed.
tandem::Workload make_classifier(const tandem::WorkloadOptions& o) {
  tandem::check_params("aug-cls", o.params, {});  // it takes no --param key=value
  torch::manual_seed(o.seed);
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)), nn::ReLU(),
                     nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)),
                     nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(32 * 8 * 8, kClasses));
  net->to(o.device);
  tandem::AugmentSpec spec;  // RandomCrop(32) of 40x40, RandomHorizontalFlip, Normalize
  spec.crop_h = spec.crop_w = spec.out_h = spec.out_w = kImageSize;
  spec.max_rotation_deg = 0;
  spec.blur_kernel = 1;
  spec.hflip_probability = 0.5;
  spec.mean = {127.5, 127.5, 127.5};  // (pixel - mean) / std, in pixel units (0..255)
  spec.std = {64, 64, 64};

  tandem::Workload w;
  w.name = "aug-cls";
  w.device = o.device;
  w.data = tandem::DataSource::from_dataset(std::make_shared<BandsDataset>());
  // (B, 3, 40, 40) uint8 -> (B, 3, 32, 32) float32; per-sample parameters drawn on the device
  // from a generator of the run's own, which the stage registers: each graph replay draws fresh
  // parameters, the ones an eager step would.
  w.feeds.push_back(tandem::augment_feed(spec, tandem::seeded_generator(o.device, o.seed)));
  w.train.inputs = {"image", "label"};
  w.train.loss = [net = net.ptr()](const tandem::Tensors& in) {  // per-sample, then a mean:
    return at::cross_entropy_loss(net->forward(in[0]), in[1], {}, at::Reduction::None).mean();
  };  // deterministic on CUDA, where nll_loss's own mean accumulates with atomics
  w.train.optimizer = std::make_shared<tandem::optim::Sgd>(
      net->parameters(), tandem::optim::SgdOptions{/*lr=*/0.01, /*momentum=*/0.9});
  w.train.what = "small CNN, cross-entropy";
  return w;
}

int main(int argc, char** argv) try {
  tandem::run::RunRequest options;  // what `tandem bench` fills from its flags
  options.workload.name = "aug-cls";
  options.workload.description = "small CNN behind a crop/flip/normalize stage, 32x32";
  options.workload.gpu_batch_size = 256;
  options.workload.cpu_batch_size = 4;
  options.workload.make = make_classifier;
  bool sweep = false;
  auto number = [](const std::string& flag, const std::string& value) -> int64_t {
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    TORCH_CHECK(!value.empty() && *end == '\0', flag, " '", value, "' is not a number");
    return n;  // resolve() checks the range
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--sweep") {
      sweep = true;
      continue;
    }
    if (i + 1 == argc) throw tandem::InvalidArgument("option " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--device")
      options.device = value;  // auto, cpu, cuda, cuda:N
    else if (flag == "--mode")
      options.mode = tandem::run::parse_run_mode(value);  // a mode, or auto
    else if (flag == "--trace")
      options.trace_path = value;
    else if (flag == "--steps")
      options.steps = number(flag, value);
    else if (flag == "--batch-size")
      options.batch_size = number(flag, value);
    else
      throw tandem::InvalidArgument("unknown option '" + flag + "'");
  }
  options = tandem::run::resolve(options);  // the device's defaults; throws naming a bad value
  std::cout << tandem::run::describe_request(options) << "\n";

  // Mode auto: short trials of every mode, then the fastest; a named mode runs as asked. Then
  // warm-up steps, then timed steps.
  const tandem::run::AutoReport a = tandem::run::run_auto(options);
  for (const tandem::run::Trial& t : a.resolution.trials)
    std::printf("  trial %-17s %10.2f steps/s %s\n", t.mode.c_str(), t.steps_per_s.value_or(0),
                t.error.c_str());
  if (!a.resolution.trials.empty())
    std::printf("auto: picked %s (%s)\n\n", a.resolution.decision.mode.c_str(),
                a.resolution.decision.reason.c_str());
  const tandem::run::RunReport& result = a.report;
  std::cout << tandem::run::describe_report(result);
  if (!options.trace_path.empty()) std::cout << "wrote " << options.trace_path << "\n";
  if (!std::isfinite(result.losses.back())) throw tandem::Error("the last loss is not finite");

  if (sweep) {  // run_sweep adds serial, the baseline of the speedups, at each batch size
    tandem::run::SweepOptions s;
    s.modes = {tandem::run::mode_name(options.mode)};
    s.batch_sizes = {*options.batch_size, 2 * *options.batch_size};
    s.base = options;
    s.base.trace_path.clear();
    const std::vector<tandem::run::SweepRow> rows = tandem::run::run_sweep(s);
    std::cout << "\n" << tandem::run::sweep_table(rows);
    for (const tandem::run::SweepRow& r : rows)
      if (!r.error.empty()) throw tandem::Error(r.mode + " failed: " + r.error);
  }
  return 0;
} catch (const std::exception& e) {  // tandem::Error, c10::Error: one line (no backtrace)
  std::fprintf(stderr, "augmented_classifier: error: %s\n", tandem::first_line(e.what()).c_str());
  return 1;
}
