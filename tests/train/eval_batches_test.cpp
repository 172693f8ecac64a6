// An evaluation's loader parts (eval_part_size) and their batches (for_each_eval_batch): every
// worker gets a part to decode, whole parts make batches of exactly the batch size, and every
// sample is seen once, in order, the short last batch included.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "job_util.h"
#include "tandem/lane.h"
#include "tandem/random_dataset.h"

namespace tandem::train {
namespace {

using detail::eval_loader_options;
using detail::eval_part_size;
using detail::for_each_eval_batch;

TEST(EvalBatchesTest, PartsAreDivisorsThatKeepEveryWorkerBusy) {
  EXPECT_EQ(eval_part_size(256, 15), 16);  // 16 parts a batch: all 15 workers decode
  EXPECT_EQ(eval_part_size(256, 1), 256);
  EXPECT_EQ(eval_part_size(10, 3), 2);   // ceil(10 / 3) = 4 does not divide 10
  EXPECT_EQ(eval_part_size(7, 2), 1);    // a prime batch: parts of one
  EXPECT_EQ(eval_part_size(4, 0), 4);    // no workers given: one part
  EXPECT_EQ(eval_part_size(3, 8), 1);    // more workers than samples
}

TEST(EvalBatchesTest, EverySampleOnceInOrderInBatchesOfTheBatchSize) {
  const auto data = std::make_shared<RandomDataset>(
      std::vector<RandomField>{{"x", {3}, at::kFloat, 0, 1}, {"y", {}, at::kLong, 0, 100}}, 23,
      7);
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  // The reference: the whole set as one batch of one worker.
  Loader whole(data, eval_loader_options(23, 1));
  Batch all;
  load_next_batch(whole, all, lane);

  std::vector<int64_t> sizes;
  std::vector<at::Tensor> xs, ys;
  int prepared = 0;
  for_each_eval_batch(
      data, 8, 3, lane,
      [&](Batch& b) {
        ++prepared;
        return std::vector<at::Tensor>{b.get("x").clone(), b.get("y").clone()};
      },
      [&](const std::vector<at::Tensor>& xy) {
        sizes.push_back(xy[0].size(0));
        xs.push_back(xy[0]);
        ys.push_back(xy[1]);
      });
  EXPECT_EQ(sizes, (std::vector<int64_t>{8, 8, 7}));
  EXPECT_EQ(prepared, 12);  // parts of 2 (ceil(8 / 3) = 3 does not divide 8): 11 full, 1 short
  EXPECT_TRUE(at::cat(xs).equal(all.get("x")));
  EXPECT_TRUE(at::cat(ys).equal(all.get("y")));
}

}  // namespace
}  // namespace tandem::train
