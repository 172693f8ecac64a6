// LossLog: records land in order; a full log counts what it could not store and refuses to be
// read as if complete; bad losses are rejected by name; on the GPU a captured record appends the
// next entry on every replay, interleaved in order with eager records.
#include "loss_log.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph.h"
#include "tandem/error.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::kCpu;
using test_support::kCuda;

at::Tensor scalar(float v, c10::Device device) {
  return at::full({}, v, at::TensorOptions().dtype(at::kFloat).device(device));
}

// The message of the InvalidArgument that record(loss) throws, or "" if it does not throw.
std::string record_error(LossLog& log, const at::Tensor& loss) {
  try {
    log.record(loss);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(LossLogTest, RecordsInOrderOnCpu) {
  LossLog log(4, kCpu);
  EXPECT_EQ(log.records(), 0);
  EXPECT_TRUE(log.values().empty());
  log.record(scalar(3.5f, kCpu));
  log.record(at::full({1}, -1.25f));  // a (1,) tensor is one element too
  log.record(scalar(7.f, kCpu).requires_grad_());
  EXPECT_EQ(log.records(), 3);
  EXPECT_EQ(log.overflowed(), 0);
  EXPECT_EQ(log.values(), (std::vector<float>{3.5f, -1.25f, 7.f}));
}

TEST(LossLogTest, OverflowIsCountedAndReportedOnRead) {
  LossLog log(2, kCpu);
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f}) log.record(scalar(v, kCpu));
  EXPECT_EQ(log.records(), 5);
  EXPECT_EQ(log.overflowed(), 3);
  try {
    log.values();
    FAIL() << "reading an overflowed log did not throw";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("holds 2 entries but 5 losses were recorded"), std::string::npos) << what;
    EXPECT_NE(what.find("the last 3 were dropped"), std::string::npos) << what;
  }
}

TEST(LossLogTest, RejectsWhatIsNotAOneElementFloatLossOnItsDevice) {
  LossLog log(4, kCpu);
  std::string what = record_error(log, at::full({}, 1.0, at::kDouble));
  EXPECT_NE(what.find("a Double tensor of shape [] on cpu"), std::string::npos) << what;
  EXPECT_NE(what.find("one-element float32 tensors on cpu"), std::string::npos) << what;
  what = record_error(log, at::full({2}, 1.f));
  EXPECT_NE(what.find("a Float tensor of shape [2] on cpu"), std::string::npos) << what;
  what = record_error(log, at::Tensor());
  EXPECT_NE(what.find("an undefined tensor"), std::string::npos) << what;
  EXPECT_EQ(log.records(), 0);  // nothing rejected was counted
  EXPECT_THROW(LossLog(-1, kCpu), InvalidArgument);
}

TEST(LossLogGpuTest, EagerRecordsAndAForeignDevice) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("log", kCuda);
  LaneGuard guard(lane);
  LossLog log(8, kCuda);
  for (float v : {0.5f, -2.f, 9.25f}) log.record(scalar(v, kCuda));
  EXPECT_EQ(log.values(), (std::vector<float>{0.5f, -2.f, 9.25f}));
  const std::string what = record_error(log, scalar(1.f, kCpu));
  EXPECT_NE(what.find("on cpu"), std::string::npos) << what;
  EXPECT_NE(what.find("tensors on cuda:0"), std::string::npos) << what;
}

// Capture once, replay N times: each replay appends the next entry (the index is read on the
// device), in order with eager records between replays; past the capacity records are counted.
TEST(LossLogGpuTest, ACapturedRecordAppendsOnEveryReplay) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Lane lane = Lane::create("log", kCuda);
  LaneGuard guard(lane);
  LossLog log(9, kCuda);
  at::Tensor step = scalar(0.f, kCuda);  // the "loss" of the captured work: 1, 2, 3, ...
  log.record(scalar(10.f, kCuda));
  GraphOptions o;
  o.name = "loss log";
  o.static_tensors = {step};
  GraphedStep graph(o);
  graph.capture(lane, [&] {
    step.add_(1);
    log.record(step);
  });
  EXPECT_EQ(log.records(), 1) << "capture ran the record";
  for (int i = 0; i < 5; ++i) graph.replay(lane);
  EXPECT_EQ(log.values(), (std::vector<float>{10.f, 1.f, 2.f, 3.f, 4.f, 5.f}));
  log.record(scalar(20.f, kCuda));
  graph.replay(lane);
  log.record(scalar(30.f, kCuda));
  EXPECT_EQ(log.values(), (std::vector<float>{10.f, 1.f, 2.f, 3.f, 4.f, 5.f, 20.f, 6.f, 30.f}));
  graph.replay(lane);
  graph.replay(lane);
  EXPECT_EQ(log.records(), 11);
  EXPECT_EQ(log.overflowed(), 2);
  EXPECT_THROW(log.values(), c10::Error);
}

}  // namespace
}  // namespace tandem
