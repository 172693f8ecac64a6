// GraphedStage and WarmupBarrier: a graphed stage runs eagerly on the CPU, and on the GPU warms
// up, captures, replays and falls back to eager on another shape; the barrier holds captures
// until every stage has warmed up, is released by stages that go away, and cancel() wakes and
// fails every waiter.
#include "graphed_stage.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tandem/error.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::kCuda;

// The message wait() throws once the barrier is cancelled.
std::string cancelled_message(const std::string& stage) {
  return "stage '" + stage +
         "' stopped waiting for the other graphed stages' warm-up: another stage failed";
}

TEST(GraphedStageTest, AWarmupBarrierHoldsCapturesUntilEveryStageHasWarmedUp) {
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

TEST(GraphedStageTest, StagesThatGoAwayBeforeTheirWarmUpEndsReleaseTheBarrier) {
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

// A stage whose peer failed before finishing its warm-up (so it never arrives) must not wait
// for the barrier's timeout: cancel() wakes every waiter into an error naming its stage.
TEST(GraphedStageTest, CancelWakesEveryWaiterWithAnError) {
  WarmupBarrier barrier;
  barrier.join();  // never arrives
  std::vector<std::future<std::string>> waiters;
  for (const std::string stage : {"encoder", "decoder", "train"})
    waiters.push_back(std::async(std::launch::async, [&barrier, stage]() -> std::string {
      try {
        barrier.wait(stage);
        return "returned without an error";
      } catch (const Error& e) {
        return e.what();
      }
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them block (not required)
  EXPECT_FALSE(barrier.cancelled());
  barrier.cancel();
  EXPECT_TRUE(barrier.cancelled());
  const std::vector<std::string> stages{"encoder", "decoder", "train"};
  for (size_t i = 0; i < waiters.size(); ++i) {
    // Generous: only so that a missed wake-up fails the test instead of hanging it.
    ASSERT_EQ(waiters[i].wait_for(std::chrono::seconds(20)), std::future_status::ready)
        << stages[i] << " still waits after cancel()";
    EXPECT_EQ(waiters[i].get(), cancelled_message(stages[i]));
  }
}

TEST(GraphedStageTest, CancelIsStickyEvenWhenNothingIsPending) {
  WarmupBarrier barrier;
  barrier.wait("before");  // nothing pending: returns
  barrier.cancel();
  for (int i = 0; i < 2; ++i) {
    try {
      barrier.wait("late");  // throws at once, although no stage is pending
      FAIL() << "wait() returned after cancel()";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), cancelled_message("late"));
    }
  }
  barrier.join();
  barrier.arrive();
  EXPECT_THROW(barrier.wait("later"), Error);
}

// Work of a GraphedStage in the tests below: out = 2 x + 1.
std::vector<at::Tensor> twice_plus_one(const std::vector<at::Tensor>& in) {
  return {in[0].mul(2).add_(1)};
}

TEST(GraphedStageTest, OnTheCpuEveryItemRunsEagerly) {
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

TEST(GraphedStageTest, ANegativeWarmUpIsRejected) {
  EXPECT_THROW(GraphedStage(GraphOptions{}, twice_plus_one, GraphOutputs::kStatic, nullptr, -1),
               InvalidArgument);
}

TEST(GraphedStageGpuTest, WarmsUpCapturesReplaysAndRunsAnotherShapeEagerly) {
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

TEST(GraphedStageGpuTest, WithFewerItemsThanItsWarmUpItSaysItNeverCaptured) {
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

// A stage whose barrier was cancelled during its warm-up fails at its capture, with the
// barrier's error, and leaves its lane usable.
TEST(GraphedStageGpuTest, ACancelledBarrierFailsTheCaptureNotTheWarmUp) {
  TANDEM_SKIP_WITHOUT_CUDA();
  auto barrier = std::make_shared<WarmupBarrier>();
  barrier->join();  // a peer that will never finish its warm-up
  GraphOptions o;
  o.name = "train";
  GraphedStage stage(o, twice_plus_one, GraphOutputs::kStatic, barrier, /*warmup_steps=*/1);
  const Lane lane = Lane::create("graph", kCuda);
  LaneGuard guard(lane);
  const at::Tensor x = at::full({4}, 3.0, at::TensorOptions().device(kCuda));
  EXPECT_TRUE(stage.run(lane, 0, {x})[0].equal(x * 2 + 1));  // warm-up: no wait
  barrier->cancel();
  try {
    stage.run(lane, 1, {x});
    FAIL() << "the capture went ahead on a cancelled barrier";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), cancelled_message("train"));
  }
  EXPECT_FALSE(stage.captured());
  EXPECT_TRUE(x.mul(2).equal(at::full({4}, 6.0, at::TensorOptions().device(kCuda))));
}

}  // namespace
}  // namespace tandem
