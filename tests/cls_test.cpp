// The cls workload: model as SPEC defines it, datasets, and every mode training; gpu_aug and
// pipelined compute the same losses for the same seed (CPU here, GPU with the label gpu).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "tandem/scenarios/cls.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(ClsTest, ModelHasTheSpecsShapeAndParameterCount) {
  auto m = make_cls_model();
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

std::vector<float> train(const std::string& mode, c10::Device device, bool learnable,
                         int64_t batch_size, int64_t steps) {
  // The toy task trains with inputs normalized to about [-2, 2] and a larger step than SPEC's
  // default, so a few dozen steps show learning; SPEC's settings are what the benchmark uses.
  ScenarioOptions o;
  o.batch_size = batch_size;
  o.workers = 2;
  o.seed = 77;
  o.device = device;
  ClsOptions c;
  c.learnable = learnable;
  if (learnable) {
    c.augment.mean = {128, 128, 128};
    c.augment.std = {64, 64, 64};
    c.lr = 0.05;
  }
  ClsScenario scenario(o, c);
  scenario.prepare(mode, steps)->run(steps);
  return scenario.losses();
}

TEST(ClsTest, GpuAugAndPipelinedComputeTheSameLossesOnCpu) {
  testing::use_deterministic_algorithms();
  const auto a = train("gpu_aug", c10::Device(c10::kCPU), false, 2, 6);
  const auto b = train("pipelined", c10::Device(c10::kCPU), false, 2, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "first differing step " << i;
}

double mean(const std::vector<float>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + from, v.begin() + to, 0.0) / static_cast<double>(to - from);
}

TEST(ClsTest, EveryModeLearnsTheToyTask) {
  for (const auto& mode : ClsScenario::kModes) {
    const auto losses = train(mode, c10::Device(c10::kCPU), /*learnable=*/true, 4, 24);
    for (float l : losses) ASSERT_TRUE(std::isfinite(l)) << mode;
    EXPECT_LT(mean(losses, 18, 24), mean(losses, 0, 6) - 0.3) << mode << ": loss did not fall";
  }
}

TEST(ClsGpuTest, GpuAugAndPipelinedComputeTheSameLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto a = train("gpu_aug", cuda, false, 8, 24);
  const auto b = train("pipelined", cuda, false, 8, 24);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "first differing step " << i;
}

TEST(ClsGpuTest, EveryModeLearnsTheToyTask) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const auto& mode : ClsScenario::kModes) {
    const auto losses = train(mode, c10::Device(c10::kCUDA, 0), true, 16, 40);
    EXPECT_LT(mean(losses, 30, 40), mean(losses, 0, 10) - 0.05) << mode;
  }
}

}  // namespace
}  // namespace tandem
