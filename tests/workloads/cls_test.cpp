// The cls workload: model as docs/reference-workloads.md defines it, datasets, and every mode
// training; every mode with the GPU augmentation stage computes the serial losses for the same seed
// (CPU here, GPU with the label gpu): the graphs draw the augmentation parameters from the run's
// generator exactly as eager steps do. A short last batch runs eagerly in the graphed modes.
// Augmenting on the loader's workers (param augment=cpu, the Python loops' cpu_aug) trains too.
#include "tandem/workloads/cls.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <set>

#include "tandem/augmented_dataset.h"
#include "tandem/models/reference_nets.h"
#include "tandem/runner.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::has;

TEST(ClsTest, ModelHasTheReferenceShapeAndParameterCount) {
  auto m = models::reference_cls_net();
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, 44746784 + 4096 * 10 + 10);
  at::NoGradGuard no_grad;
  EXPECT_EQ(m->forward(at::rand({2, 3, 256, 256})).sizes(), (at::IntArrayRef{2, 10}));
}

TEST(ClsTest, DatasetIsAFunctionOfTheIndexAndTheToyLabelSetsTheBrightness) {
  ClsDataset random(100, 5), toy(100, 5, /*learnable=*/true);
  auto sample = [](const ClsDataset& d, int64_t i) {
    std::vector<at::Tensor> out{at::empty({3, 256, 256}, at::kByte), at::empty({}, at::kLong)};
    d.get(i, out);
    return out;
  };
  EXPECT_TRUE(sample(random, 7)[0].equal(sample(random, 7)[0]));
  EXPECT_FALSE(sample(random, 7)[0].equal(sample(random, 8)[0]));
  std::set<int64_t> labels;
  for (int64_t i = 0; i < 40; ++i) {
    labels.insert(sample(random, i)[1].item<int64_t>());
    const auto s = sample(toy, i);
    const int64_t label = s[1].item<int64_t>();
    ASSERT_TRUE(label == 0 || label == 1) << label;
    EXPECT_GE(s[0].min().item<int>(), label * 192);
    EXPECT_LT(s[0].max().item<int>(), label * 192 + 64);
  }
  EXPECT_GT(labels.size(), 5u);  // random labels cover many of the 10 classes
  EXPECT_LT(*labels.rbegin(), kClsClasses);
}

TEST(ClsTest, AugmentParamChoosesTheDataPathAndUnknownValuesAreRefused) {
  WorkloadOptions wo;
  wo.batch_size = 2;
  EXPECT_EQ(make_cls(wo).workload.feeds.size(), 1u);  // the GPU augment stage
  wo.params["augment"] = "cpu";
  const Workload cpu = make_cls(wo).workload;
  EXPECT_TRUE(cpu.feeds.empty());  // the loader's workers augment
  EXPECT_EQ(cpu.data.dataset()->fields()[0].dtype, at::kFloat);
  wo.params["augment"] = "tpu";
  EXPECT_THROW(make_cls(wo), InvalidArgument);
}

TEST(ClsTest, AugmentedDatasetAppliesTheReferenceWithPerIndexParameters) {
  auto source = std::make_shared<ClsDataset>(10, 3);
  AugmentSpec spec;
  AugmentedDataset aug(source, spec, 9);
  ASSERT_EQ(aug.fields()[0].dtype, at::kFloat);
  std::vector<at::Tensor> out{at::empty({3, 256, 256}, at::kFloat), at::empty({}, at::kLong)};
  aug.get(4, out);
  std::vector<at::Tensor> raw{at::empty({3, 256, 256}, at::kByte), at::empty({}, at::kLong)};
  source->get(4, raw);
  at::Tensor want = at::empty({3, 256, 256}, at::kFloat);
  augment_sample_cpu(raw[0], draw_augment_params_host(spec, 256, 256, 9, 4), 0, spec, want);
  EXPECT_TRUE(out[0].equal(want));
  EXPECT_EQ(out[1].item<int64_t>(), raw[1].item<int64_t>());
}

struct Run {
  std::vector<float> losses;
  std::string notes;  // joined with " | "
};

/// `mode` is a mode's name, or "cpu_aug": serial with the augmentation on the loader's workers.
Run run(const std::string& mode, c10::Device device, bool learnable, int64_t batch_size,
        int64_t steps, int64_t last_batch_size = 0) {
  // The toy task trains with inputs normalized to about [-2, 2] and a larger step than the
  // workload's default, so a few dozen steps show learning; the defaults are what the benchmark
  // uses.
  WorkloadOptions wo;
  wo.batch_size = batch_size;
  wo.seed = 77;
  wo.device = device;
  ClsOptions c;
  c.learnable = learnable;
  if (learnable) {
    c.augment.mean = {128, 128, 128};
    c.augment.std = {64, 64, 64};
    c.lr = 0.05;
  }
  if (mode == "cpu_aug") c.augment_on = AugmentOn::kCpu;
  RunOptions o;
  o.mode = mode == "cpu_aug" ? Mode::kSerial : parse_mode(mode);
  o.batch_size = batch_size;
  o.workers = 2;
  o.last_batch_size = last_batch_size;
  Runner runner(make_cls(wo, c).workload, o);
  Run r{runner.train(steps), ""};
  for (const auto& note : runner.notes()) r.notes += note + " | ";
  return r;
}

/// Every way cls runs: cpu_aug, then each mode with the GPU augmentation stage.
std::vector<std::string> every_mode() {
  std::vector<std::string> out{"cpu_aug"};
  for (const Mode m : workload_modes()) out.push_back(to_string(m));
  return out;
}

std::vector<float> train(const std::string& mode, c10::Device device, bool learnable,
                         int64_t batch_size, int64_t steps) {
  return run(mode, device, learnable, batch_size, steps).losses;
}

void expect_same_losses(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(want[i], got[i]) << "first differing step " << i;
}

TEST(ClsTest, SerialAndPipelinedComputeTheSameLossesOnCpu) {
  testing::use_deterministic_algorithms();
  const auto a = train("serial", c10::Device(c10::kCPU), false, 2, 6);
  const auto b = train("pipelined", c10::Device(c10::kCPU), false, 2, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "first differing step " << i;
}

TEST(ClsTest, GraphedModesRunEagerlyOnTheCpuAndComputeSerialsLosses) {
  testing::use_deterministic_algorithms();
  const c10::Device cpu(c10::kCPU);
  const auto want = run("serial", cpu, false, 2, 5, /*last_batch_size=*/1);
  EXPECT_EQ(want.notes, "");
  for (const std::string mode : {"graphed", "pipelined+graphed"}) {
    SCOPED_TRACE(mode);
    const auto got = run(mode, cpu, false, 2, 5, 1);
    expect_same_losses(want.losses, got.losses);
    EXPECT_EQ(got.notes,
              "CUDA graphs need a CUDA device: mode " + mode + " ran eagerly on the CPU | ");
  }
}

double mean(const std::vector<float>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + from, v.begin() + to, 0.0) / static_cast<double>(to - from);
}

// Both data paths learn: the augmentation on the loader's workers (cpu_aug) and the augment
// stage (serial). The other modes compute serial's losses bitwise on the CPU (the equivalence
// tests above and ReferenceWorkloadsTest), so training them again here would only cost CI time
// (a 256x256 step is about a second on one core); on the GPU every mode trains (ClsGpuTest).
TEST(ClsTest, BothDataPathsLearnTheToyTask) {
  for (const std::string mode : {"cpu_aug", "serial"}) {
    const auto losses = train(mode, c10::Device(c10::kCPU), /*learnable=*/true, 4, 24);
    for (float l : losses) ASSERT_TRUE(std::isfinite(l)) << mode;
    EXPECT_LT(mean(losses, 18, 24), mean(losses, 0, 6) - 0.3) << mode << ": loss did not fall";
  }
}

TEST(ClsGpuTest, SerialAndPipelinedComputeTheSameLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto a = train("serial", cuda, false, 8, 24);
  const auto b = train("pipelined", cuda, false, 8, 24);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "first differing step " << i;
}

// Bitwise: the graphs replay the eager kernels, and the generator registered with the graph
// that draws the parameters advances by the same Philox increment per replay as per eager draw.
TEST(ClsGpuTest, GraphedModesComputeSerialsLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);  // deterministic cuBLAS (before first use)
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto want = run("serial", cuda, false, 8, 24);
  const auto graphed = run("graphed", cuda, false, 8, 24);
  expect_same_losses(want.losses, graphed.losses);
  EXPECT_TRUE(has(graphed.notes,
                  "captured: step (augment: parameters drawn from the run's "
                  "generator, fused augment kernel; train: forward, cross-entropy, "
                  "backward, tandem::optim::Sgd step) as one graph after 3 eager "
                  "warm-up steps"))
      << graphed.notes;
  EXPECT_TRUE(has(graphed.notes, "; 21 replays |")) << graphed.notes;
  EXPECT_FALSE(has(graphed.notes, "ran eagerly")) << graphed.notes;

  const auto both = run("pipelined+graphed", cuda, false, 8, 24);
  expect_same_losses(want.losses, both.losses);
  EXPECT_TRUE(has(both.notes,
                  "captured: augment (augment: parameters drawn from the run's "
                  "generator, fused augment kernel) as one graph on lane augment"))
      << both.notes;
  EXPECT_TRUE(has(both.notes,
                  "captured: train (train: forward, cross-entropy, backward, "
                  "tandem::optim::Sgd step) as one graph on lane train"))
      << both.notes;
  EXPECT_FALSE(has(both.notes, "ran eagerly")) << both.notes;
}

TEST(ClsGpuTest, AShortLastBatchRunsEagerlyInTheGraphedModes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto want = run("serial", cuda, false, 8, 8, /*last_batch_size=*/5);
  for (const std::string mode : {"graphed", "pipelined+graphed"}) {
    SCOPED_TRACE(mode);
    const auto got = run(mode, cuda, false, 8, 8, 5);
    expect_same_losses(want.losses, got.losses);
    EXPECT_TRUE(has(got.notes, "step 7 ran eagerly")) << got.notes;
    EXPECT_TRUE(has(got.notes, "input 0 is [5, 3, 256, 256], captured [8, 3, 256, 256]"))
        << got.notes;
    EXPECT_TRUE(has(got.notes, "; 4 replays |")) << got.notes;
  }
}

TEST(ClsGpuTest, EveryModeLearnsTheToyTask) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const auto& mode : every_mode()) {
    const auto losses = train(mode, c10::Device(c10::kCUDA, 0), true, 16, 40);
    EXPECT_LT(mean(losses, 30, 40), mean(losses, 0, 10) - 0.05) << mode;
  }
}

}  // namespace
}  // namespace tandem
