// GraphedStep (CUDA graphs): capture records and does not execute; replays run only what was
// captured; a K-iteration capture advances K per replay; bad captures fail clearly; dropout
// under replay draws new masks; a registered generator draws the eager sequence under replay;
// one thread may capture while another replays. (GraphedStage: graphed_stage_test.cpp.)
#include "graph.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tandem/error.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::kCuda;

at::Tensor counter() { return at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(kCuda)); }

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

// A replay runs at the priority of the stream it is launched into, as eager kernels do: the
// graph is instantiated without cudaGraphInstantiateFlagUseNodePriority (LibTorch's choice),
// whose per-node priorities CUDA honours only as a hint (seg's decoder graph on a high-priority
// lane ran 7% slower with it, docs/notes/pipeline-and-graphs.md). Graphs with cuBLAS and cuDNN
// kernels replay correctly on a high- and on a normal-priority lane.
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
    g.capture(Lane::create("graph", kCuda),
              [&] { at::rand({16}, gen, at::TensorOptions().device(kCuda)); });
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

}  // namespace
}  // namespace tandem
