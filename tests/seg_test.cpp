// The seg workload: model definitions as SPEC states them, and pipelined training computing
// exactly what serial training computes (losses and final weights), on the CPU and the GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tandem/error.h"
#include "tandem/scenarios/seg.h"
#include "test_util.h"

namespace tandem {
namespace {

int64_t count_parameters(torch::nn::Sequential& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(SegTest, ParameterCountsMatchTheSpec) {
  auto enc = make_seg_encoder();
  auto dec = make_seg_decoder();
  EXPECT_EQ(count_parameters(enc), 44746784);
  EXPECT_EQ(count_parameters(dec), 44744090);
}

TEST(SegTest, ShapesFlowFromImageToPerPixelLogits) {
  at::NoGradGuard no_grad;
  auto enc = make_seg_encoder();
  auto dec = make_seg_decoder();
  const at::Tensor x = at::rand({1, 3, 256, 256});
  const at::Tensor f = enc->forward(x);
  EXPECT_EQ(f.sizes(), (at::IntArrayRef{1, 4096, 1, 1}));
  EXPECT_EQ(dec->forward(f).sizes(), (at::IntArrayRef{1, 10, 256, 256}));
}

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> weights;
};

Trained train(const std::string& mode, c10::Device device, int64_t batch_size, int64_t steps) {
  ScenarioOptions o;
  o.batch_size = batch_size;
  o.workers = 3;
  o.seed = 1234;
  o.device = device;
  SegScenario scenario(o);
  scenario.prepare(mode, steps)->run(steps);
  Trained t;
  t.losses = scenario.losses();
  for (const auto& p : scenario.decoder()->parameters()) t.weights.push_back(p.detach().cpu());
  return t;
}

void expect_same_training(const Trained& serial, const Trained& pipelined) {
  ASSERT_EQ(serial.losses.size(), pipelined.losses.size());
  for (size_t i = 0; i < serial.losses.size(); ++i)
    ASSERT_EQ(serial.losses[i], pipelined.losses[i]) << "first differing loss at step " << i;
  ASSERT_EQ(serial.weights.size(), pipelined.weights.size());
  for (size_t i = 0; i < serial.weights.size(); ++i)
    ASSERT_TRUE(serial.weights[i].equal(pipelined.weights[i])) << "decoder parameter " << i;
  // The run really trained: losses are finite, vary, and weights moved away from the start.
  EXPECT_NE(serial.losses.front(), serial.losses.back());
  for (float l : serial.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(SegTest, PipelinedTrainsExactlyLikeSerialOnCpu) {
  testing::use_deterministic_algorithms();
  const auto serial = train("serial", c10::Device(c10::kCPU), 1, 20);
  const auto pipelined = train("pipelined", c10::Device(c10::kCPU), 1, 20);
  expect_same_training(serial, pipelined);
}

TEST(SegGpuTest, PipelinedTrainsExactlyLikeSerial) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto serial = train("serial", cuda, 4, 24);
  const auto pipelined = train("pipelined", cuda, 4, 24);
  expect_same_training(serial, pipelined);
}

TEST(SegTest, RejectsUnknownMode) {
  ScenarioOptions o;
  o.batch_size = 1;
  SegScenario scenario(o);
  EXPECT_THROW(scenario.prepare("overlapped", 1), InvalidArgument);
}

}  // namespace
}  // namespace tandem
