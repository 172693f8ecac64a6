// Pipeline: which stage works on which item at each tick, in both modes; batches carry data
// from stage to stage; a stage's failure stops every stage and surfaces as a StageError naming
// stage, lane and item, on the CPU and on CUDA lanes. (Handoffs and slot reuse on the GPU:
// handoff_gpu_test.cpp.)
#include "pipeline.h"

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "graphed_stage.h"
#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace {

// What each stage did, in the global order the host threads did it.
struct Event {
  int stage;
  int64_t item;
  bool end;  // false: stage starts the item; true: it finished enqueueing it
  int ring_slot = -1;
};

std::vector<Event> trace(PipelineMode mode, int stages, int64_t items) {
  const c10::Device cpu(c10::kCPU);
  std::mutex mutex;
  std::vector<Event> events;
  auto log = [&](Event e) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(e);
  };
  std::vector<Stage> s;
  for (int i = 0; i < stages; ++i)
    s.push_back(
        {"s" + std::to_string(i), Lane::create("lane", cpu), [&log, i](Batch& b, const Lane&) {
           log({i, b.index, false, b.ring_slot});
           // Each stage adds 10^i, so the last one sees the sum of every earlier stage.
           at::Tensor prev = b.has("v") ? b.get("v") : at::zeros({1}, at::kLong);
           b.set("v", prev + static_cast<int64_t>(std::pow(10, i)));
           std::this_thread::sleep_for(std::chrono::microseconds(100 * (b.index % 3)));
           log({i, b.index, true, b.ring_slot});
         }});
  Pipeline p(std::move(s), mode, Lane::create("serial", cpu));
  p.run(items);
  return events;
}

TEST(PipelineTest, SerialRunsEveryStageOfAnItemBeforeTheNext) {
  const auto ev = trace(PipelineMode::kSerial, 3, 4);
  ASSERT_EQ(ev.size(), 24u);
  for (int64_t item = 0; item < 4; ++item)
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(ev[item * 6 + s * 2].stage, s);
      EXPECT_EQ(ev[item * 6 + s * 2].item, item);
      // One item in flight: a ring of 2 slots, taken in turn.
      EXPECT_EQ(ev[item * 6 + s * 2].ring_slot, item % 2);
    }
}

TEST(PipelineTest, PipelinedStagesTakeItemsInOrderAfterTheirProducer) {
  const int K = 3;
  const int64_t n = 40;
  const auto ev = trace(PipelineMode::kPipelined, K, n);
  ASSERT_EQ(ev.size(), static_cast<size_t>(2 * K * n));
  std::vector<int64_t> next(K, 0);
  std::vector<std::vector<bool>> finished(K, std::vector<bool>(n, false));
  int64_t started_first = 0, finished_last = 0;
  std::vector<int64_t> slot_item(K + 1, -1);  // the item each ring slot holds
  for (const auto& e : ev) {
    // Every stage of an item sees the slot it was given; a slot holds one item at a time, and
    // goes to a new item only once the last stage has finished the one before.
    ASSERT_GE(e.ring_slot, 0);
    ASSERT_LE(e.ring_slot, K);
    if (!e.end && e.stage == 0) {
      const int64_t previous = slot_item[e.ring_slot];
      if (previous >= 0) {
        EXPECT_TRUE(finished[K - 1][previous])
            << "slot " << e.ring_slot << " given to item " << e.item << " while item " << previous
            << " held it";
      }
      slot_item[e.ring_slot] = e.item;
    }
    EXPECT_EQ(slot_item[e.ring_slot], e.item) << "stage " << e.stage << " item " << e.item;
    if (!e.end) {
      EXPECT_EQ(e.item, next[e.stage]++) << "stage " << e.stage << " out of order";
      if (e.stage > 0) {
        EXPECT_TRUE(finished[e.stage - 1][e.item])
            << "stage " << e.stage << " started item " << e.item << " before its producer";
      }
      if (e.stage == 0) ++started_first;
    } else {
      finished[e.stage][e.item] = true;
      if (e.stage == K - 1) ++finished_last;
    }
    // The ring bounds the items in flight: depth() + 1 = K + 1 slots.
    EXPECT_LE(started_first - finished_last, K + 1);
  }
  for (int s = 0; s < K; ++s) EXPECT_EQ(next[s], n);
}

TEST(PipelineTest, PipelinedStagesReallyOverlap) {
  // Stage 1 on item 1 waits until stage 0 has started item 2: possible only if the stages run
  // concurrently. Serial execution would time out here. (Item 0 goes through alone: see
  // TheFirstItemGoesThroughTheStagesAlone.)
  const c10::Device cpu(c10::kCPU);
  std::mutex mutex;
  std::condition_variable cv;
  bool second_item_started = false;
  bool overlapped = false;
  std::vector<Stage> s;
  s.push_back({"first", Lane::create("a", cpu), [&](Batch& b, const Lane&) {
                 std::lock_guard<std::mutex> lock(mutex);
                 if (b.index == 2) second_item_started = true;
                 cv.notify_all();
               }});
  s.push_back({"second", Lane::create("b", cpu), [&](Batch& b, const Lane&) {
                 if (b.index != 1) return;
                 std::unique_lock<std::mutex> lock(mutex);
                 overlapped = cv.wait_for(lock, std::chrono::seconds(10),
                                          [&] { return second_item_started; });
               }});
  Pipeline p(std::move(s), PipelineMode::kPipelined, Lane::create("serial", cpu));
  p.run(4);
  EXPECT_TRUE(overlapped);
}

// Item 0 runs through the stages one at a time (so that libraries tuning themselves on their
// first call time their candidates on an idle device): no stage works on anything else while
// a stage works on item 0, and every later item still overlaps as before.
TEST(PipelineTest, TheFirstItemGoesThroughTheStagesAlone) {
  for (const bool alone : {true, false}) {
    SCOPED_TRACE(alone ? "first item alone" : "first item overlapped");
    const c10::Device cpu(c10::kCPU);
    std::mutex mutex;
    std::vector<Event> events;
    std::vector<Stage> s;
    for (int i = 0; i < 3; ++i)
      s.push_back(
          {"s" + std::to_string(i), Lane::create("lane", cpu), [&, i](Batch& b, const Lane&) {
             {
               std::lock_guard<std::mutex> lock(mutex);
               events.push_back({i, b.index, false});
             }
             // Item 0 takes long enough for the other stages to start item 1 if allowed.
             if (b.index == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
             std::lock_guard<std::mutex> lock(mutex);
             events.push_back({i, b.index, true});
           }});
    Pipeline p(std::move(s), PipelineMode::kPipelined, Lane::create("serial", cpu));
    EXPECT_TRUE(p.first_item_alone());  // the default
    p.set_first_item_alone(alone);
    p.run(6);
    ASSERT_EQ(events.size(), 36u);
    // While item 0 is in a stage, nothing else starts; and item 1 starts only after the last
    // stage has finished item 0.
    int in_item0 = 0;
    bool item0_done = false, overlapped = false;
    for (const auto& e : events) {
      if (e.item == 0) {
        in_item0 += e.end ? -1 : 1;
        if (e.end && e.stage == 2) item0_done = true;
      } else if (!e.end && (in_item0 > 0 || !item0_done)) {
        overlapped = true;
      }
    }
    EXPECT_EQ(overlapped, !alone);
  }
}

TEST(PipelineTest, BatchesCarryDataThroughEveryStageInBothModes) {
  for (auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    const c10::Device cpu(c10::kCPU);
    std::vector<int64_t> seen;
    std::vector<Stage> s;
    s.push_back({"make", Lane::create("a", cpu),
                 [](Batch& b, const Lane&) { b.set("x", at::full({2}, b.index, at::kLong)); }});
    s.push_back({"double", Lane::create("b", cpu), [](Batch& b, const Lane&) {
                   b.set("y", b.get("x") * 2);
                   b.erase("x");
                 }});
    s.push_back({"check", Lane::create("c", cpu), [&](Batch& b, const Lane&) {
                   EXPECT_FALSE(b.has("x"));
                   seen.push_back(b.get("y")[1].item<int64_t>());
                 }});
    Pipeline p(std::move(s), mode, Lane::create("serial", cpu));
    EXPECT_EQ(p.depth(), mode == PipelineMode::kSerial ? 1 : 3);
    p.run(6);
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 2, 4, 6, 8, 10})) << to_string(mode);
    seen.clear();
    p.run(2);  // a pipeline can run again
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 2})) << to_string(mode);
  }
}

// Runs `p` for `items` on another thread and returns the StageError it throws; fails (instead
// of hanging the test binary) if it does not return within a generous bound.
StageError run_expecting_stage_error(Pipeline& p, int64_t items) {
  auto done = std::async(std::launch::async, [&] { p.run(items); });
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "run() did not return after a stage failed";
    std::abort();  // the pipeline's threads still reference `p`: no way to unwind cleanly
  }
  try {
    done.get();
  } catch (const StageError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a StageError, got: " << e.what();
    throw;
  }
  ADD_FAILURE() << "run() returned although a stage threw";
  throw std::logic_error("no StageError");
}

// Three stages on lanes "lane-a", "lane-b", "lane-c"; stage "boom" (the second) throws
// std::runtime_error("disk on fire\nsecond line") at item `fail_at`.
std::vector<Stage> stages_failing_at(int64_t fail_at) {
  const c10::Device cpu(c10::kCPU);
  std::vector<Stage> s;
  s.push_back({"ok", Lane::create("lane-a", cpu), [](Batch&, const Lane&) {}});
  s.push_back({"boom", Lane::create("lane-b", cpu), [fail_at](Batch& b, const Lane&) {
                 if (b.index == fail_at) throw std::runtime_error("disk on fire\nsecond line");
               }});
  s.push_back({"after", Lane::create("lane-c", cpu), [](Batch&, const Lane&) {}});
  return s;
}

TEST(PipelineTest, AStageFailureIsAStageErrorNamingStageLaneAndItemInBothModes) {
  const c10::Device cpu(c10::kCPU);
  for (const auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    // Item 0 fails while the other stages wait for it to go through alone (pipelined); item 3
    // fails with the stages overlapping.
    for (const int64_t fail_at : {0, 3}) {
      SCOPED_TRACE(std::string(to_string(mode)) + ", failing at item " + std::to_string(fail_at));
      Pipeline p(stages_failing_at(fail_at), mode, Lane::create("serial", cpu));
      int calls = 0;
      p.set_on_error([&] { ++calls; });
      const StageError e = run_expecting_stage_error(p, 10);
      const std::string lane = mode == PipelineMode::kSerial ? "serial" : "lane-b";
      EXPECT_EQ(e.stage(), "boom");
      EXPECT_EQ(e.lane(), lane);
      EXPECT_EQ(e.item(), fail_at);
      EXPECT_EQ(e.cause(), "disk on fire");
      EXPECT_EQ(std::string(e.what()), "stage 'boom' (lane " + lane + ") failed at step " +
                                           std::to_string(fail_at) + ": disk on fire");
      EXPECT_EQ(calls, 1);
      ASSERT_TRUE(e.original());
      EXPECT_THROW(std::rethrow_exception(e.original()), std::runtime_error);
      // tandem::Error is the base of everything tandem throws.
      EXPECT_NE(dynamic_cast<const Error*>(&e), nullptr);
      // The pipeline is left usable: a run without the failing item succeeds.
      EXPECT_NO_THROW(p.run(std::min<int64_t>(fail_at, 2)));
      EXPECT_EQ(calls, 1);
    }
  }
}

TEST(PipelineTest, AStageErrorReportsOnlyTheFirstLineOfATorchError) {
  const c10::Device cpu(c10::kCPU);
  for (const auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    std::vector<Stage> s;
    s.push_back({"load", Lane::create("a", cpu), [](Batch&, const Lane&) {}});
    s.push_back({"train", Lane::create("decoder", cpu), [](Batch& b, const Lane&) {
                   if (b.index == 2) at::add(at::ones({2}), at::ones({3}));  // c10::Error
                 }});
    Pipeline p(std::move(s), mode, Lane::create("serial", cpu));
    const StageError e = run_expecting_stage_error(p, 5);
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.find("Exception raised from"), std::string::npos) << what;
    EXPECT_NE(what.find("must match the size of tensor b"), std::string::npos) << what;
    EXPECT_EQ(what.rfind("stage 'train' (lane ", 0), 0u) << what;
    EXPECT_EQ(e.item(), 2);
    EXPECT_EQ(e.cause().find('\n'), std::string::npos);
  }
}

TEST(PipelineTest, AStageErrorIsNotWrappedTwice) {
  const c10::Device cpu(c10::kCPU);
  std::vector<Stage> s;
  s.push_back({"outer", Lane::create("a", cpu), [](Batch& b, const Lane&) {
                 if (b.index == 1) throw StageError("inner", "lane-x", 7, "deep cause");
               }});
  Pipeline p(std::move(s), PipelineMode::kSerial, Lane::create("serial", cpu));
  const StageError e = run_expecting_stage_error(p, 3);
  EXPECT_EQ(e.stage(), "inner");
  EXPECT_EQ(e.item(), 7);
  EXPECT_EQ(std::string(e.what()), "stage 'inner' (lane lane-x) failed at step 7: deep cause");
}

// A stage blocked on something outside the pipeline (here the WarmupBarrier a graphed stage
// waits on before it captures) is released by the on_error hook, which runs before run() joins
// the stage threads; the error reported is the first stage's, not the one it woke.
TEST(PipelineTest, OnErrorRunsOnceBeforeTheStagesAreJoinedAndCanWakeABlockedStage) {
  const c10::Device cpu(c10::kCPU);
  auto barrier = std::make_shared<WarmupBarrier>();
  barrier->join();  // a stage that will never arrive
  std::atomic<int> calls{0};
  std::vector<Stage> s;
  s.push_back({"load", Lane::create("a", cpu), [](Batch& b, const Lane&) {
                 if (b.index == 2) throw std::runtime_error("no more data");
               }});
  s.push_back({"train", Lane::create("b", cpu), [barrier](Batch& b, const Lane&) {
                 if (b.index == 1) barrier->wait("train");  // blocks until cancelled
               }});
  s.push_back({"after", Lane::create("c", cpu), [](Batch&, const Lane&) {}});
  Pipeline p(std::move(s), PipelineMode::kPipelined, Lane::create("serial", cpu));
  p.set_on_error([&] {
    ++calls;
    barrier->cancel();
  });
  const StageError e = run_expecting_stage_error(p, 10);
  EXPECT_EQ(e.stage(), "load");
  EXPECT_EQ(e.item(), 2);
  EXPECT_EQ(e.cause(), "no more data");
  EXPECT_EQ(calls.load(), 1) << "on_error must run once even when a second stage fails";
}

TEST(PipelineTest, AnOnItemHookThatThrowsIsReportedForItsStage) {
  const c10::Device cpu(c10::kCPU);
  for (const auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    Pipeline p(stages_failing_at(-1), mode, Lane::create("serial", cpu));
    auto done = std::async(std::launch::async, [&] {
      p.run(6, [](int stage, int64_t item) {
        if (stage == 2 && item == 4) throw std::runtime_error("hook failed");
      });
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    try {
      done.get();
      FAIL() << "no error";
    } catch (const StageError& e) {
      EXPECT_EQ(e.stage(), "after");
      EXPECT_EQ(e.item(), 4);
      EXPECT_EQ(e.cause(), "hook failed");
    }
  }
}

// On CUDA lanes a failure stops the pipeline as on the CPU: the first stage, blocked on the
// host until a ring slot's done marker (a timing event for timed items) completes, still
// returns, since the marker waits only for work already enqueued; and the pipeline runs again.
TEST(PipelineGpuTest, AStageFailureOnCudaLanesStopsEveryStage) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    SCOPED_TRACE(to_string(mode));
    std::vector<Stage> s;
    s.push_back({"load", Lane::create("lane-load", cuda), [](Batch&, const Lane&) {}});
    s.push_back({"boom", Lane::create("lane-boom", cuda), [](Batch& b, const Lane&) {
                   if (b.index == 7) throw std::runtime_error("device stage failed");
                 }});
    // Milliseconds per item on the device: the first stage runs ahead and waits for slots.
    s.push_back({"train", Lane::create("lane-train", cuda),
                 [](Batch&, const Lane&) { at::cuda::sleep(5'000'000); }});
    Pipeline p(std::move(s), mode, Lane::create("serial", cuda));
    p.set_timing(2);  // items 2.. mark their slots with timing events
    int calls = 0;
    p.set_on_error([&] { ++calls; });
    const StageError e = run_expecting_stage_error(p, 20);
    EXPECT_EQ(e.stage(), "boom");
    EXPECT_EQ(e.lane(), mode == PipelineMode::kSerial ? "serial" : "lane-boom");
    EXPECT_EQ(e.item(), 7);
    EXPECT_EQ(e.cause(), "device stage failed");
    EXPECT_EQ(calls, 1);
    EXPECT_NO_THROW(p.run(5));
    c10::cuda::device_synchronize();
  }
}

// One item in every n is sampled for device time, at a position that rotates block by block,
// so work with any period dividing n (e.g. a graph replayed on every 4th item) is sampled in
// every phase alike.
TEST(PipelineTest, DeviceTimeSamplesRotateThroughEveryPhase) {
  for (const int64_t n : {1, 2, 3, 4, 8}) {
    std::vector<int> per_phase(n, 0);
    int64_t sampled = 0;
    for (int64_t k = 0; k < n * n; ++k) {
      if (!Pipeline::samples_device_time(k, n)) continue;
      ++sampled;
      ++per_phase[k % n];
    }
    EXPECT_EQ(sampled, n) << "one per block of " << n;
    for (int64_t phase = 0; phase < n; ++phase)
      EXPECT_EQ(per_phase[phase], 1) << "every " << n << ", phase " << phase;
  }
  EXPECT_TRUE(Pipeline::samples_device_time(0, 4));   // the first timed item is always sampled
  EXPECT_FALSE(Pipeline::samples_device_time(4, 4));  // the second block samples its 2nd item
  EXPECT_TRUE(Pipeline::samples_device_time(5, 4));
}

TEST(PipelineTest, BatchGetNamesTheMissingTensor) {
  Batch b;
  b.index = 4;
  b.set("image", at::zeros({1}));
  try {
    b.get("label");
    FAIL();
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("'label'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("image"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem
