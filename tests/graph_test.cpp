// CUDA graphs: capture records and does not execute; replays run only what was captured; a
// K-iteration capture advances K per replay; bad captures fail clearly; the mlp workload's
// graphed modes compute the eager losses; dropout under replay draws new masks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "tandem/error.h"
#include "tandem/graph.h"
#include "tandem/scenarios/mlp.h"
#include "test_util.h"

namespace tandem {
namespace {

const c10::Device kCuda(c10::kCUDA, 0);

at::Tensor counter() {
  return at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(kCuda));
}

TEST(GraphTest, ACpuLaneIsRejected) {
  GraphedStep g;
  EXPECT_THROW(g.capture(Lane::create("cpu", c10::Device(c10::kCPU)), [] {}), InvalidArgument);
}

TEST(GraphTest, CopyIntoStaticRefusesAnotherShape) {
  at::Tensor dst = at::zeros({4, 3});
  EXPECT_TRUE(copy_into_static(dst, at::ones({4, 3})));
  EXPECT_TRUE(dst.equal(at::ones({4, 3})));
  EXPECT_FALSE(copy_into_static(dst, at::full({2, 3}, 7.0)));  // a short last batch
  EXPECT_TRUE(dst.equal(at::ones({4, 3})));
}

TEST(GraphGpuTest, CaptureDoesNotExecuteReplayDoes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("graph", kCuda);
  at::Tensor c = counter();
  GraphedStep g;
  g.capture(lane, [&] { c.add_(1); });
  lane.synchronize();
  EXPECT_EQ(c.item<int64_t>(), 0) << "capture executed the work";
  for (int i = 0; i < 3; ++i) g.replay(lane);
  lane.synchronize();
  EXPECT_EQ(c.item<int64_t>(), 3);
}

TEST(GraphGpuTest, OnlyWhatWasCapturedReplays) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("graph", kCuda);
  at::Tensor inside = counter(), outside = counter();
  GraphedStep g;
  {
    LaneGuard guard(lane);
    outside.add_(10);  // before the capture: not part of it
  }
  g.capture(lane, [&] { inside.add_(1); });
  {
    LaneGuard guard(lane);
    outside.add_(100);  // after the capture: not part of it either
  }
  g.replay(lane);
  g.replay(lane);
  lane.synchronize();
  EXPECT_EQ(inside.item<int64_t>(), 2);
  EXPECT_EQ(outside.item<int64_t>(), 110);
}

TEST(GraphGpuTest, KIterationCaptureAdvancesKPerReplay) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("graph", kCuda);
  at::Tensor c = counter();
  GraphedStep g;
  g.capture(lane, [&] {
    for (int k = 0; k < 5; ++k) c.add_(1);
  });
  for (int i = 0; i < 4; ++i) g.replay(lane);
  lane.synchronize();
  EXPECT_EQ(c.item<int64_t>(), 20);
}

TEST(GraphGpuTest, AHostSyncInsideTheStepFailsClearlyAndLeavesTheLaneUsable) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("graph", kCuda);
  at::Tensor c = counter();
  GraphOptions o;
  o.name = "train";
  GraphedStep g(o);
  try {
    g.capture(lane, [&] {
      c.add_(1);
      if (c.item<int64_t>() > 5) c.add_(1);  // .item(): a host sync
    });
    FAIL() << "capture of a host sync succeeded";
  } catch (const GraphCaptureError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stage 'train'"), std::string::npos) << what;
    EXPECT_NE(what.find("host synchronization"), std::string::npos) << what;
  }
  EXPECT_FALSE(g.captured());
  {
    LaneGuard guard(lane);
    c.add_(1);
  }
  lane.synchronize();
  EXPECT_EQ(c.item<int64_t>(), 1);
}

TEST(GraphGpuTest, ACpuStaticTensorIsRejectedBeforeCapture) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GraphOptions o;
  o.name = "train";
  o.static_tensors = {at::zeros({2})};
  GraphedStep g(o);
  try {
    g.capture(Lane::create("graph", kCuda), [] {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("static tensor 0 is on cpu"), std::string::npos)
        << e.what();
  }
}

TEST(GraphGpuTest, DropoutDrawsNewMasksOnEveryReplayAndASeedReproducesThem) {
  TANDEM_SKIP_WITHOUT_CUDA();
  auto masks = [](uint64_t seed) {
    at::manual_seed(seed);
    const Lane lane = Lane::create("graph", kCuda);
    const at::Tensor ones = at::ones({4096}, at::TensorOptions().device(kCuda));
    at::Tensor out = at::zeros_like(ones);
    GraphedStep g;
    g.capture(lane, [&] { out.copy_(at::dropout(ones, 0.5, /*train=*/true)); });
    std::vector<at::Tensor> seen;
    for (int i = 0; i < 2; ++i) {
      g.replay(lane);
      lane.synchronize();
      seen.push_back(out.clone());
    }
    return seen;
  };
  const auto a = masks(3), b = masks(3);
  EXPECT_FALSE(a[0].equal(a[1])) << "two replays drew the same dropout mask";
  EXPECT_TRUE(a[0].equal(b[0]) && a[1].equal(b[1])) << "a seeded run did not reproduce";
}

std::vector<float> mlp_losses(const std::string& mode, c10::Device device, int64_t steps) {
  ScenarioOptions o;
  o.batch_size = 64;
  o.seed = 5;
  o.device = device;
  MlpScenario s(o);
  s.prepare(mode, steps)->run(steps);
  return s.losses();
}

TEST(MlpTest, ModelAndCpuFallbackOfTheGraphedModes) {
  auto m = make_mlp_model();
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, 4096 * 2048 + 2048 + 2048 * 1024 + 1024);
  ScenarioOptions o;
  o.batch_size = 4;
  MlpScenario s(o);
  s.prepare("graphed", 3)->run(3);
  ASSERT_FALSE(s.notes().empty());
  EXPECT_NE(s.notes()[0].find("ran eagerly on the CPU"), std::string::npos);
}

TEST(MlpGpuTest, GraphedModesComputeTheEagerLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);  // deterministic cuBLAS (before first use)
  testing::use_deterministic_algorithms();
  const auto eager = mlp_losses("eager", kCuda, 24);
  for (const std::string mode : {"graphed", "graphed_k"}) {
    const auto graphed = mlp_losses(mode, kCuda, 24);
    ASSERT_EQ(graphed.size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i)
      ASSERT_NEAR(graphed[i], eager[i], 1e-6 * std::abs(eager[i])) << mode << " step " << i;
  }
}

}  // namespace
}  // namespace tandem
