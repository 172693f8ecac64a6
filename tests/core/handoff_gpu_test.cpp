// Handoff safety on the GPU: a producer lane and a consumer lane pass >= 1000 batches while
// memory is freed and reallocated between them; the consumer verifies each batch's checksum.
// A missing event wait (consumer reads before the producer wrote) or a missing recordStream
// (the allocator recycles a block the consumer still reads) shows up as a mismatch. The ring's
// slots are reused only after their previous item is done, timed or not, across runs too.
#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <gtest/gtest.h>

#include <optional>

#include "pipeline.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(HandoffGpuTest, ThousandsOfHandoffsWithReallocationStayIntact) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(cuda);
  const int64_t items = 1500;
  at::Tensor checked = at::zeros({1}, i64);     // consumer increments per batch
  at::Tensor mismatches = at::zeros({1}, i64);  // consumer increments per bad checksum

  auto length = [](int64_t item) { return (int64_t{1} << 15) + (item % 5) * 4096; };
  auto expected_sum = [&](int64_t item) {
    const int64_t n = length(item), k = item % 13 + 1;
    return k * n * (n - 1) / 2 + item * n;
  };

  std::vector<Stage> stages;
  stages.push_back({"produce", Lane::create("producer", cuda), [&](Batch& b, const Lane&) {
                      const int64_t n = length(b.index), k = b.index % 13 + 1;
                      // A late write: a consumer that does not wait for it reads garbage.
                      if (b.index % 3 == 0) at::cuda::sleep(20000);
                      b.set("x", at::arange(n, i64) * k + b.index);
                      // Churn: same-sized blocks filled with poison on the producer lane. Without
                      // recordStream they would land in blocks consumers still read.
                      for (int j = 0; j < 3; ++j) at::full({length(b.index + j)}, -7, i64);
                    }});
  stages.push_back({"consume", Lane::create("consumer", cuda), [&](Batch& b, const Lane&) {
                      at::cuda::sleep(50000);  // the consumer lags: the producer runs ahead
                      const at::Tensor sum = b.get("x").sum();
                      mismatches.add_(sum.ne(expected_sum(b.index)));
                      checked.add_(1);
                      b.erase("x");
                    }});
  Pipeline pipeline(std::move(stages), PipelineMode::kPipelined, Lane::create("serial", cuda));
  pipeline.run(items);
  EXPECT_EQ(checked.item<int64_t>(), items);
  EXPECT_EQ(mismatches.item<int64_t>(), 0);
}

TEST(HandoffGpuTest, PipelinedStagesRunOnTheirOwnStreams) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<std::optional<c10::cuda::CUDAStream>> seen(3);  // one entry per stage thread
  std::vector<Stage> stages;
  for (int i = 0; i < 3; ++i)
    stages.push_back(
        {"s", Lane::create("lane" + std::to_string(i), cuda), [&seen, i](Batch&, const Lane& lane) {
           EXPECT_EQ(c10::cuda::getCurrentCUDAStream(0), lane.stream());
           seen[i] = lane.stream();
         }});
  Pipeline p(std::move(stages), PipelineMode::kPipelined, Lane::create("serial", cuda));
  p.run(1);
  ASSERT_TRUE(seen[0] && seen[1] && seen[2]);
  EXPECT_NE(*seen[0], *seen[1]);
  EXPECT_NE(*seen[1], *seen[2]);
}

// A slot is reused only once the last stage of its previous item is done on the device: for a
// timed item the marker is the stage's timing end event, for an untimed one an event of its own,
// and across runs the previous run's marker, which the pipeline keeps alive (shared ownership).
// The last stage counts finished items into pinned host memory; when stage 0 starts item n,
// item n - slots must be counted. A slot handed out early shows up as a count that lags.
TEST(PipelineGpuTest, ASlotWaitsForTheEndOfItsPreviousItemTimedOrNot) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  for (const PipelineMode mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    at::Tensor count = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(cuda));
    at::Tensor seen = at::zeros({1}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    const volatile int64_t* seen_ptr = seen.data_ptr<int64_t>();
    const int stages = 2;
    std::vector<Stage> s;
    for (int i = 0; i < stages; ++i)
      s.push_back({"s" + std::to_string(i), Lane::create("lane" + std::to_string(i), cuda),
                   [&, i](Batch&, const Lane&) {
                     at::cuda::sleep(1000000);  // about a millisecond: the host runs ahead
                     if (i + 1 < stages) return;
                     count.add_(1);
                     seen.copy_(count, /*non_blocking=*/true);
                   }});
    Pipeline p(std::move(s), mode, Lane::create("serial", cuda));
    const int64_t slots = p.depth() + 1, items = 12;
    p.set_timing(3);  // items 0..2 untimed, the rest timed
    for (int64_t run = 0; run < 2; ++run) {
      p.run(items, [&](int stage, int64_t item) {
        if (stage != 0) return;
        const int64_t done_before = run * items + item - slots + 1;  // items before n - slots + 1
        EXPECT_GE(*seen_ptr, done_before)
            << to_string(mode) << " run " << run << " item " << item << ": slot reused early";
      });
      EXPECT_GT(p.timing().slot_wait_ms_per_item, 0.0) << to_string(mode);
    }
    EXPECT_EQ(count.item<int64_t>(), 2 * items);
  }
}

// Device time is sampled on every n-th timed item (no trace): the sampled items' mean, n in the
// report; host time still counts every item.
TEST(PipelineGpuTest, DeviceTimingSamplesEveryNthTimedItem) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<Stage> s;
  s.push_back(
      {"work", Lane::create("work", cuda), [](Batch&, const Lane&) { at::cuda::sleep(200000); }});
  Pipeline p(std::move(s), PipelineMode::kSerial, Lane::create("serial", cuda));
  EXPECT_THROW(p.set_timing(0, 0), c10::Error);
  p.set_timing(2, 3);
  p.run(14);
  const Pipeline::Timing t = p.timing();
  EXPECT_EQ(t.items, 12);
  EXPECT_EQ(t.device_timing_every, 3);
  ASSERT_EQ(t.stages.size(), 1u);
  EXPECT_GT(t.stages[0].device_ms_per_item, 0.0);
  EXPECT_GT(t.stages[0].host_ms_per_item, 0.0);
}

}  // namespace
}  // namespace tandem
