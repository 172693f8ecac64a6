// Pipeline: which stage works on which item at each tick, in both modes; batches carry data
// from stage to stage; errors propagate. Runs on the CPU (the GPU variant is in
// handoff_gpu_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "tandem/pipeline.h"

namespace tandem {
namespace {

struct Event {
  int64_t tick;
  int stage;
  int64_t item;
  bool operator==(const Event& o) const {
    return std::tie(tick, stage, item) == std::tie(o.tick, o.stage, o.item);
  }
};

std::vector<Event> trace(PipelineMode mode, int stages, int64_t items) {
  const c10::Device cpu(c10::kCPU);
  std::vector<Event> events;
  int64_t tick = -1;
  std::vector<Stage> s;
  for (int i = 0; i < stages; ++i)
    s.push_back({"s" + std::to_string(i), Lane::create("lane", cpu),
                 [&events, &tick, i](Batch& b, const Lane&) {
                   events.push_back({tick, i, b.index});
                   // Each stage adds 10^i, so the last one sees the sum of every earlier stage.
                   at::Tensor prev = b.has("v") ? b.get("v") : at::zeros({1}, at::kLong);
                   b.set("v", prev + static_cast<int64_t>(std::pow(10, i)));
                 }});
  Pipeline p(std::move(s), mode, Lane::create("serial", cpu));
  p.run(items, [&](int64_t t) { tick = t; });
  return events;
}

TEST(PipelineTest, SerialRunsEveryStageOfAnItemBeforeTheNext) {
  const auto ev = trace(PipelineMode::kSerial, 3, 4);
  ASSERT_EQ(ev.size(), 12u);
  for (int64_t item = 0; item < 4; ++item)
    for (int s = 0; s < 3; ++s) EXPECT_EQ(ev[item * 3 + s], (Event{item, s, item}));
}

TEST(PipelineTest, PipelinedStageIWorksOnItemTMinusI) {
  const int K = 3;
  const int64_t n = 5;
  const auto ev = trace(PipelineMode::kPipelined, K, n);
  ASSERT_EQ(ev.size(), static_cast<size_t>(K * n));
  for (const auto& e : ev) EXPECT_EQ(e.item, e.tick - e.stage) << "stage " << e.stage;
  // Ticks: fill (0..K-2), steady state, drain; n + K - 1 in all.
  EXPECT_EQ(ev.back().tick, n + K - 2);
  // Within a tick, downstream stages are enqueued first.
  for (size_t i = 1; i < ev.size(); ++i)
    if (ev[i].tick == ev[i - 1].tick) {
      EXPECT_LT(ev[i].stage, ev[i - 1].stage);
    }
}

TEST(PipelineTest, BatchesCarryDataThroughEveryStageInBothModes) {
  for (auto mode : {PipelineMode::kSerial, PipelineMode::kPipelined}) {
    const c10::Device cpu(c10::kCPU);
    std::vector<int64_t> seen;
    std::vector<Stage> s;
    s.push_back({"make", Lane::create("a", cpu), [](Batch& b, const Lane&) {
                   b.set("x", at::full({2}, b.index, at::kLong));
                 }});
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

TEST(PipelineTest, StageErrorsPropagate) {
  const c10::Device cpu(c10::kCPU);
  std::vector<Stage> s;
  s.push_back({"ok", Lane::create("a", cpu), [](Batch&, const Lane&) {}});
  s.push_back({"boom", Lane::create("b", cpu), [](Batch& b, const Lane&) {
                 if (b.index == 3) throw std::runtime_error("stage failed at 3");
               }});
  Pipeline p(std::move(s), PipelineMode::kPipelined, Lane::create("serial", cpu));
  EXPECT_THROW(p.run(10), std::runtime_error);
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
