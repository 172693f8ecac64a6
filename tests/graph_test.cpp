// CUDA graphs: capture records and does not execute; replays run only what was captured; a
// K-iteration capture advances K per replay; bad captures fail clearly; the mlp workload's
// graphed modes compute the eager losses; dropout under replay draws new masks; a registered
// generator draws the eager sequence under replay; one thread may capture while another
// replays; GraphedStage warms up, captures, replays and falls back to eager on another shape.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "tandem/error.h"
#include "tandem/graph.h"
#include "tandem/graphed_stage.h"
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

TEST(GraphTest, AWarmupBarrierHoldsCapturesUntilEveryStageHasWarmedUp) {
  WarmupBarrier barrier;
  barrier.join();
  barrier.join();
  barrier.arrive();  // the capturing stage itself
  std::atomic<bool> passed{false};
  std::thread capturer([&] {
    barrier.wait("capturer");
    passed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(passed.load()) << "a capture went ahead while a stage was still warming up";
  barrier.arrive();  // the other stage finished its warm-up
  capturer.join();
  EXPECT_TRUE(passed.load());
}

TEST(GraphTest, StagesThatGoAwayBeforeTheirWarmUpEndsReleaseTheBarrier) {
  auto barrier = std::make_shared<WarmupBarrier>();
  GraphOptions o;
  o.name = "failing";
  {
    GraphedStage failing(
        o,
        [](const std::vector<at::Tensor>&) -> std::vector<at::Tensor> {
          throw std::runtime_error("boom");
        },
        GraphOutputs::kStatic, barrier);
    GraphOptions other = o;
    other.name = "other";
    GraphedStage waiting(
        other, [](const std::vector<at::Tensor>& in) { return in; }, GraphOutputs::kStatic,
        barrier);
  }  // both gone without finishing their warm-up: neither may leave the barrier pending
  barrier->wait("after");  // returns at once
  SUCCEED();
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

// A replay runs at the priority of the stream it is launched into, as eager kernels do: the
// graph is instantiated without cudaGraphInstantiateFlagUseNodePriority (LibTorch's choice),
// whose per-node priorities CUDA honours only as a hint (seg's decoder graph on a high-priority
// lane ran 7% slower with it, NOTES.md). Graphs with cuBLAS and cuDNN kernels replay correctly
// on a high- and on a normal-priority lane.
TEST(GraphGpuTest, GraphsRunAtTheirLanesPriorityNotTheirNodes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (LanePriority priority : {LanePriority::kHigh, LanePriority::kNormal}) {
    const Lane lane = Lane::create("graph", kCuda, priority);
    const auto options = at::TensorOptions().device(kCuda);
    const at::Tensor a = at::rand({64, 64}, options), image = at::rand({2, 3, 16, 16}, options);
    const at::Tensor weight = at::rand({4, 3, 3, 3}, options);
    auto work = [&] { return at::conv2d(image, weight).sum() + at::mm(a, a).relu().sum(); };
    at::Tensor out;
    {
      LaneGuard guard(lane);  // warm-up: cuBLAS and cuDNN set up outside the capture
      out = work();
    }
    GraphedStep g;
    g.capture(lane, [&] { out = work(); });
    const unsigned long long flags = g.instantiate_flags();
    EXPECT_EQ(flags & cudaGraphInstantiateFlagUseNodePriority, 0u);
    EXPECT_NE(flags & cudaGraphInstantiateFlagAutoFreeOnLaunch, 0u);
    {
      LaneGuard guard(lane);
      out.zero_();
    }
    g.replay(lane);
    lane.synchronize();
    EXPECT_NEAR(out.item<float>(), work().item<float>(), 1e-2 * std::abs(work().item<float>()));
  }
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

TEST(GraphGpuTest, ARegisteredGeneratorDrawsTheEagerSequenceOneDrawPerReplay) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const auto f32 = at::TensorOptions().device(kCuda);
  const Lane lane = Lane::create("graph", kCuda);
  LaneGuard guard(lane);  // every draw, eager or replayed, on one stream
  auto generator = [] {
    at::Generator g = at::cuda::detail::createCUDAGenerator(0);
    g.set_current_seed(11);
    return g;
  };
  // The reference: five eager draws.
  at::Generator eager_gen = generator();
  std::vector<at::Tensor> eager;
  for (int i = 0; i < 5; ++i) eager.push_back(at::rand({4096}, eager_gen, f32));
  // The same five, interleaving eager draws and replays: eager, (capture), replay, replay,
  // eager, replay. Capture draws nothing; each replay draws once, from the offset at replay.
  at::Generator gen = generator();
  GraphOptions o;
  o.generators = {gen};
  GraphedStep g(o);
  at::Tensor out = at::zeros({4096}, f32);
  std::vector<at::Tensor> seen;
  seen.push_back(at::rand({4096}, gen, f32));
  g.capture(lane, [&] { out.copy_(at::rand({4096}, gen, f32)); });
  for (int i = 0; i < 2; ++i) {
    g.replay(lane);
    seen.push_back(out.clone());
  }
  seen.push_back(at::rand({4096}, gen, f32));
  g.replay(lane);
  seen.push_back(out.clone());
  lane.synchronize();
  EXPECT_FALSE(seen[1].equal(seen[2])) << "two replays drew the same numbers";
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(seen[i].equal(eager[i])) << "draw " << i;
}

TEST(GraphGpuTest, AnUnregisteredGeneratorFailsTheCaptureAndSaysWhichOption) {
  TANDEM_SKIP_WITHOUT_CUDA();
  at::Generator gen = at::cuda::detail::createCUDAGenerator(0);
  GraphOptions o;
  o.name = "augment";
  GraphedStep g(o);
  try {
    g.capture(Lane::create("graph", kCuda), [&] {
      at::rand({16}, gen, at::TensorOptions().device(kCuda));
    });
    FAIL() << "a draw from an unregistered generator was captured";
  } catch (const GraphCaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("GraphOptions::generators"), std::string::npos)
        << e.what();
  }
}

TEST(GraphGpuTest, ACpuGeneratorIsRejectedBeforeCapture) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GraphOptions o;
  o.generators = {at::detail::createCPUGenerator()};
  GraphedStep g(o);
  try {
    g.capture(Lane::create("graph", kCuda), [] {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("generator 0 is cpu"), std::string::npos) << e.what();
  }
}

// LibTorch marks the default CUDA generator "capturing" for the length of any capture; without
// GraphedStep's mutex a replay on another thread in that window throws ("Offset increment
// outside graph capture encountered unexpectedly"). pipelined+graphed does exactly this: one
// stage replays while the next captures.
TEST(GraphGpuTest, OneThreadCapturesWhileAnotherReplays) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane replay_lane = Lane::create("replay", kCuda);
  const Lane capture_lane = Lane::create("capture", kCuda);
  at::Tensor replayed = counter(), captured = counter();
  c10::cuda::device_synchronize();  // the counters' zeros ran on the default stream
  GraphedStep first;
  first.capture(replay_lane, [&] { replayed.add_(1); });
  std::atomic<bool> go{false};
  std::string error;
  std::thread replayer([&] {
    try {
      while (!go) std::this_thread::yield();
      for (int i = 0; i < 2000; ++i) first.replay(replay_lane);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::vector<std::unique_ptr<GraphedStep>> graphs;
  go = true;
  for (int k = 0; k < 20; ++k) {  // captures long enough to overlap the replays
    graphs.push_back(std::make_unique<GraphedStep>());
    graphs.back()->capture(capture_lane, [&] {
      for (int i = 0; i < 200; ++i) captured.add_(1);
    });
  }
  replayer.join();
  ASSERT_EQ(error, "") << "a replay failed while another thread captured";
  for (auto& g : graphs) g->replay(capture_lane);
  replay_lane.synchronize();
  capture_lane.synchronize();
  EXPECT_EQ(replayed.item<int64_t>(), 2000);
  EXPECT_EQ(captured.item<int64_t>(), 20 * 200);
}

TEST(GraphGpuTest, AFailedCaptureLeavesRandomDrawsAndLaterGraphsWorking) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("graph", kCuda);
  at::Tensor c = counter();
  c10::cuda::device_synchronize();
  GraphedStep bad;
  EXPECT_THROW(bad.capture(lane, [&] { c.add_(c.item<int64_t>()); }), GraphCaptureError);
  LaneGuard guard(lane);
  const at::Tensor ones = at::ones({1024}, at::TensorOptions().device(kCuda));
  EXPECT_NO_THROW(at::dropout(ones, 0.5, /*train=*/true)) << "the default generator is stuck";
  GraphedStep good;
  good.capture(lane, [&] { c.add_(1); });
  good.replay(lane);
  lane.synchronize();
  EXPECT_EQ(c.item<int64_t>(), 1);
}

// Work of a GraphedStage in the tests below: out = 2 x + 1.
std::vector<at::Tensor> twice_plus_one(const std::vector<at::Tensor>& in) {
  return {in[0].mul(2).add_(1)};
}

TEST(GraphTest, AGraphedStageOnTheCpuRunsEveryItemEagerly) {
  GraphedStage stage(GraphOptions{}, twice_plus_one);
  const Lane lane = Lane::create("cpu", c10::Device(c10::kCPU));
  for (int64_t i = 0; i < 6; ++i) {
    const at::Tensor x = at::full({3}, static_cast<double>(i));
    EXPECT_TRUE(stage.run(lane, i, {x})[0].equal(x * 2 + 1)) << "item " << i;
  }
  EXPECT_FALSE(stage.captured());
  EXPECT_EQ(stage.replays(), 0);
  EXPECT_TRUE(stage.notes().empty());
}

TEST(GraphGpuTest, AGraphedStageWarmsUpCapturesReplaysAndRunsAnotherShapeEagerly) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const GraphOutputs outputs : {GraphOutputs::kStatic, GraphOutputs::kCloned}) {
    GraphOptions o;
    o.name = "double";
    GraphedStage stage(o, twice_plus_one, outputs);
    const Lane lane = Lane::create("graph", kCuda);
    LaneGuard guard(lane);
    std::vector<at::Tensor> got;
    for (int64_t i = 0; i < 7; ++i) {
      const int64_t n = i == 6 ? 3 : 5;  // item 6: a short last batch
      const at::Tensor x = at::full({n}, static_cast<double>(i), at::TensorOptions().device(kCuda));
      got.push_back(stage.run(lane, i, {x})[0]);
      EXPECT_EQ(stage.captured(), i >= kGraphWarmupSteps) << "item " << i;
      // Checked at once: a static output is rewritten by the next replay.
      EXPECT_TRUE(got.back().equal(x * 2 + 1)) << "item " << i;
    }
    EXPECT_EQ(stage.replays(), 3);  // items 3, 4, 5
    EXPECT_EQ(stage.eager_items(), std::vector<int64_t>{6});
    ASSERT_EQ(stage.notes().size(), 1u);
    EXPECT_NE(stage.notes()[0].find("double: step 6 ran eagerly"), std::string::npos)
        << stage.notes()[0];
    EXPECT_NE(stage.notes()[0].find("input 0 is [3], captured [5]"), std::string::npos)
        << stage.notes()[0];
    // Replays write the graph's own output; kCloned hands out copies that keep their values.
    const bool same_memory = got[3].data_ptr() == got[4].data_ptr();
    EXPECT_EQ(same_memory, outputs == GraphOutputs::kStatic);
    if (outputs == GraphOutputs::kCloned) {
      EXPECT_TRUE(got[3].equal(at::full({5}, 7.0, at::TensorOptions().device(kCuda))));
    }
  }
}

TEST(GraphGpuTest, AGraphedStageWithFewerItemsThanItsWarmUpSaysItNeverCaptured) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GraphOptions o;
  o.name = "double";
  GraphedStage stage(o, twice_plus_one);
  const Lane lane = Lane::create("graph", kCuda);
  LaneGuard guard(lane);
  for (int64_t i = 0; i < 2; ++i)
    stage.run(lane, i, {at::ones({4}, at::TensorOptions().device(kCuda))});
  EXPECT_FALSE(stage.captured());
  ASSERT_EQ(stage.notes().size(), 1u);
  EXPECT_NE(stage.notes()[0].find("all 2 step(s) ran eagerly"), std::string::npos)
      << stage.notes()[0];
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

TEST(MlpTest, EveryModeLogsOneLossPerStepOnCpu) {
  const auto eager = mlp_losses("eager", c10::Device(c10::kCPU), 6);
  ASSERT_EQ(eager.size(), 6u);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_GT(eager[i], 0.f) << "step " << i;
  for (const std::string mode : {"graphed", "graphed_k", "pipelined+graphed"})
    EXPECT_EQ(mlp_losses(mode, c10::Device(c10::kCPU), 6), eager) << mode;
}

// 24 steps: 3 warm-up steps, then 21 replays (graphed; pipelined+graphed, of 3 graphs in turn,
// each on inputs the copy lane staged) or 5 replays of 4 and a 1-step eager tail (graphed_k):
// every loss comes from the log, appended in step order by each path.
TEST(MlpGpuTest, GraphedModesComputeTheEagerLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);  // deterministic cuBLAS (before first use)
  testing::use_deterministic_algorithms();
  const auto eager = mlp_losses("eager", kCuda, 24);
  ASSERT_EQ(eager.size(), 24u);
  for (const std::string mode : {"graphed", "graphed_k", "pipelined+graphed"}) {
    const auto graphed = mlp_losses(mode, kCuda, 24);
    ASSERT_EQ(graphed.size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i)
      ASSERT_NEAR(graphed[i], eager[i], 1e-6 * std::abs(eager[i])) << mode << " step " << i;
  }
}

// The copy lane runs up to two items ahead of the replays and reuses each set of static inputs
// every third item: 150 steps cycle 8 batches through 3 sets many times. A copy that overtook
// the replay still reading its set would change that step's loss.
TEST(MlpGpuTest, StagedReplaysMatchEagerStepsOverManyItems) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const auto eager = mlp_losses("eager", kCuda, 150);
  const auto staged = mlp_losses("pipelined+graphed", kCuda, 150);
  ASSERT_EQ(staged.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i)
    ASSERT_NEAR(staged[i], eager[i], 1e-6 * std::abs(eager[i])) << "step " << i;
}

}  // namespace
}  // namespace tandem
