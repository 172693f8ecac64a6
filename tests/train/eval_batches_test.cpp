// An evaluation's loader parts (eval_part_size) and their batches (EvalPasses): every worker
// gets a part to decode, whole parts make batches of exactly the batch size, and every sample is
// seen once, in order, the short last batch included — in every evaluation of the run, from one
// loader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "evaluation_thread.h"
#include "job_util.h"
#include "kept_samples.h"
#include "tandem/detail/lane.h"
#include "tandem/random_dataset.h"

namespace tandem::train {
namespace {

using detail::eval_loader_options;
using detail::eval_part_size;
using detail::eval_ring_slots;
using detail::EvalPasses;
using detail::padded_to_the_batch_size;

TEST(EvalBatchesTest, PartsAreDivisorsThatKeepEveryWorkerBusy) {
  EXPECT_EQ(eval_part_size(256, 15), 16);  // 16 parts a batch: all 15 workers decode
  EXPECT_EQ(eval_part_size(256, 1), 256);
  EXPECT_EQ(eval_part_size(10, 3), 2);  // ceil(10 / 3) = 4 does not divide 10
  EXPECT_EQ(eval_part_size(7, 2), 1);   // a prime batch: parts of one
  EXPECT_EQ(eval_part_size(4, 0), 4);   // no workers given: one part
  EXPECT_EQ(eval_part_size(3, 8), 1);   // more workers than samples
}

// A small held-out set is held whole by its ring (decoded ahead, while the training runs); a
// large one gets the workers' slots, or the parts of kEvalAheadSamples where those are more.
TEST(EvalBatchesTest, TheRingHoldsASmallHeldOutSetWhole) {
  using detail::eval_ring_floor;
  using detail::kEvalAheadSamples;
  EXPECT_EQ(eval_ring_floor(15), 15 + 2);        // not the training's deeper ring
  EXPECT_EQ(eval_ring_slots(300, 256, 15), 19);  // parts of 16: 19, more than 15 + 2
  EXPECT_EQ(eval_ring_slots(100, 256, 15), eval_ring_floor(15));  // never below the workers'
  EXPECT_EQ(eval_ring_slots(100000, 256, 15), kEvalAheadSamples / 16);
  EXPECT_EQ(eval_ring_slots(100000, 256, 1), eval_ring_floor(1));  // parts of 256: 2 of them
  EXPECT_EQ(eval_ring_slots(0, 256, 15), eval_ring_floor(15));
}

TEST(EvalBatchesTest, EverySampleOnceInOrderInBatchesOfTheBatchSize) {
  const auto data = std::make_shared<RandomDataset>(
      std::vector<RandomField>{{"x", {3}, at::kFloat, 0, 1}, {"y", {}, at::kLong, 0, 100}}, 23, 7);
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  // The reference: the whole set as one batch of one worker.
  Loader whole(data, eval_loader_options(23, 1));
  Batch all;
  load_next_batch(whole, all, lane);

  EvalPasses passes(data, 8, 3);
  for (int evaluation = 0; evaluation < 3; ++evaluation) {  // the same batches every time
    SCOPED_TRACE("evaluation " + std::to_string(evaluation));
    std::vector<int64_t> sizes;
    std::vector<at::Tensor> xs, ys;
    int prepared = 0;
    passes.run(
        lane,
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
}

TEST(EvalBatchesTest, AnEvaluationStoppedMidwayLeavesTheNextWhole) {
  const auto data = std::make_shared<RandomDataset>(
      std::vector<RandomField>{{"x", {3}, at::kFloat, 0, 1}, {"y", {}, at::kLong, 0, 100}}, 9, 7);
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  EvalPasses passes(data, 4, 2);
  auto prepare = [](Batch& b) { return std::vector<at::Tensor>{b.get("y").clone()}; };
  int consumed = 0;
  EXPECT_THROW(passes.run(lane, prepare,
                          [&](const std::vector<at::Tensor>&) {
                            if (++consumed == 2) throw std::runtime_error("metric failed");
                          }),
               std::runtime_error);
  std::vector<at::Tensor> ys;
  passes.run(lane, prepare, [&](const std::vector<at::Tensor>& y) { ys.push_back(y[0]); });
  ASSERT_EQ(ys.size(), 3u);  // 4, 4, 1: from the first sample again
  Loader whole(data, eval_loader_options(9, 1));
  Batch all;
  load_next_batch(whole, all, lane);
  EXPECT_TRUE(at::cat(ys).equal(all.get("y")));
}

// A held-out set whose samples differ in size (a variable-size field, as decoded images are),
// counting each sample's reads.
class CountedImages : public Dataset {
 public:
  explicit CountedImages(int64_t n) : reads(static_cast<size_t>(n)) {}
  int64_t size() const override { return static_cast<int64_t>(reads.size()); }
  std::vector<FieldSpec> fields() const override {
    return {{"image", {2, 3}, at::kByte, true}, {"label", {}, at::kLong}};
  }
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override {
    ++reads[static_cast<size_t>(index)];
    out[0] = at::full({1 + index % 3, 3}, index, at::kByte);
    out[1].fill_(index * 10);
  }
  mutable std::vector<std::atomic<int>> reads;
};

// The workers start with the passes: a held-out set the ring holds is decoded before the first
// evaluation asks (while the first epoch trains), each sample once.
TEST(EvalBatchesTest, TheFirstPassIsDecodedBeforeTheFirstEvaluation) {
  const auto data = std::make_shared<CountedImages>(10);
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  EvalPasses passes(data, 4, 2);
  auto reads = [&] {
    int n = 0;
    for (const auto& r : data->reads) n += r.load();
    return n;
  };
  // Bounded wait for the workers (a scheduling allowance, not a measure).
  for (int i = 0; i < 1000 && reads() < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (const auto& r : data->reads) EXPECT_EQ(r.load(), 1) << "every sample decoded ahead, once";
  // The evaluation takes the decoded pass (the workers go on to the next pass's parts as its
  // slots free up).
  std::vector<at::Tensor> labels;
  passes.run(
      lane, [](Batch& b) { return std::vector<at::Tensor>{b.get("label").clone()}; },
      [&](const std::vector<at::Tensor>& y) { labels.push_back(y[0]); });
  EXPECT_TRUE(at::cat(labels).equal(at::arange(10, at::kLong) * 10));
}

// A short last batch padded for the forward: its own rows first, zeros after, up to the batch
// size, in its memory format; untouched where padding is off or the batch is whole.
TEST(EvalBatchesTest, AShortBatchIsPaddedWithZerosToTheBatchSize) {
  const at::Tensor x =
      at::rand({3, 4, 5, 6}).contiguous(at::MemoryFormat::ChannelsLast);  // 3 of a batch of 8
  const at::Tensor padded = padded_to_the_batch_size(x, 8, true);
  ASSERT_EQ(padded.sizes(), (std::vector<int64_t>{8, 4, 5, 6}));
  EXPECT_TRUE(padded.narrow(0, 0, 3).equal(x));
  EXPECT_TRUE(padded.narrow(0, 3, 5).eq(0).all().item<bool>());
  EXPECT_TRUE(padded.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(padded_to_the_batch_size(x, 8, false).is_same(x));
  EXPECT_TRUE(padded_to_the_batch_size(x, 3, true).is_same(x));
  const at::Tensor masks = at::randint(0, 5, {2, 7, 7}, at::kLong);  // a segmentation's labels
  EXPECT_EQ(padded_to_the_batch_size(masks, 4, true).size(0), 4);
}

// CountedImages whose sample `bad` fails to load, as a corrupt photo does.
class CountedImagesWithABadOne : public CountedImages {
 public:
  CountedImagesWithABadOne(int64_t n, int64_t bad) : CountedImages(n), bad_(bad) {}
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override {
    if (index == bad_) throw std::runtime_error("sample " + std::to_string(index) + " is corrupt");
    CountedImages::get_sample(index, out);
  }

 private:
  int64_t bad_;
};

int64_t total_reads(const CountedImages& d) {
  int64_t n = 0;
  for (const auto& r : d.reads) n += r.load();
  return n;
}

// The warmer reads every sample from its first on into the kept samples, each once, none
// before it; a sample that fails is left unkept (the evaluation meets it again); a later pass
// copies what it kept.
TEST(KeptSamplesWarmerTest, ReadsEverySampleFromItsFirstOnceAndKeepsThem) {
  const auto base = std::make_shared<CountedImagesWithABadOne>(40, 25);
  const auto kept = std::make_shared<detail::KeptSamples>(base, int64_t{1} << 30);
  {
    detail::KeptSamplesWarmer warmer(kept, 10, 3);
    // Bounded wait for its threads (a scheduling allowance, not a measure).
    for (int i = 0; i < 1000 && total_reads(*base) < 29; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int i = 0; i < 100 && warmer.read() < 29; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(warmer.read(), 29) << "30 samples from the 10th, one of them failing";
  }
  for (int64_t i = 0; i < 40; ++i)
    EXPECT_EQ(base->reads[static_cast<size_t>(i)].load(), i < 10 || i == 25 ? 0 : 1) << i;
  EXPECT_EQ(kept->kept_samples(), 29);
  std::vector<at::Tensor> out{at::Tensor(), at::empty({}, at::kLong)};
  kept->get_sample(30, out);  // copied from what the warmer kept: no read
  EXPECT_EQ(base->reads[30].load(), 1);
  EXPECT_TRUE(out[0].equal(at::full({1, 3}, 30, at::kByte)));
  EXPECT_EQ(out[1].item<int64_t>(), 300);
}

// The warmer stops where the budget is full (nothing decoded to be dropped beyond a sample a
// thread) and when it is destroyed mid-way (its threads joined).
TEST(KeptSamplesWarmerTest, StopsAtTheBudgetAndOnDestruction) {
  const auto base = std::make_shared<CountedImages>(100);
  // Samples of 3 to 9 image bytes and 8 label bytes; a budget of 5 typical ones.
  const auto kept = std::make_shared<detail::KeptSamples>(base, 5 * (6 + 8));
  {
    detail::KeptSamplesWarmer warmer(kept, 0, 2);
    for (int i = 0; i < 1000 && total_reads(*base) < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LE(kept->kept_bytes(), kept->budget_bytes());
  EXPECT_GE(kept->kept_samples(), 3);
  EXPECT_LE(total_reads(*base), kept->kept_samples() + 2) << "a read past the budget a thread";
  const auto many = std::make_shared<CountedImages>(1000000);
  const auto all = std::make_shared<detail::KeptSamples>(many, int64_t{1} << 30);
  { detail::KeptSamplesWarmer warmer(all, 0, 2); }  // destroyed at once: joins
  EXPECT_LT(total_reads(*many), 1000000);
}

// Kept samples: the first evaluation reads every sample, later ones only those past the budget,
// and every evaluation sees the same batches (the fixed-size fields kept apart from the slots
// the loader reuses).
TEST(KeptSamplesTest, LaterEvaluationsReadOnlyWhatDidNotFit) {
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  auto evaluate = [&](EvalPasses& passes) {
    std::vector<at::Tensor> images, labels;
    passes.run(
        lane,
        [&](Batch& b) {
          return std::vector<at::Tensor>{b.get("image").clone(), b.get("label").clone()};
        },
        [&](const std::vector<at::Tensor>& xy) {
          images.push_back(xy[0]);
          labels.push_back(xy[1]);
        });
    return std::make_pair(at::cat(images), at::cat(labels));
  };
  // 1 GiB keeps all; 0 none; 44 bytes some of the first samples read (3 to 9 image bytes and 8
  // label bytes each: 2 to 4 of them), whichever worker read them.
  for (const int64_t budget : {int64_t{1} << 30, int64_t{0}, int64_t{4 * (3 + 8)}}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const auto base = std::make_shared<CountedImages>(11);
    const auto kept = std::make_shared<detail::KeptSamples>(base, budget);
    {
      EvalPasses passes(kept, 4, 3);
      const auto first = evaluate(passes);
      EXPECT_TRUE(first.second.equal(at::arange(11, at::kLong) * 10));
      for (int again = 0; again < 2; ++again) {
        const auto later = evaluate(passes);
        EXPECT_TRUE(later.first.equal(first.first));
        EXPECT_TRUE(later.second.equal(first.second));
      }
    }  // the loader's workers joined (they may have read ahead into a fourth evaluation)
    int read_once = 0;
    for (const auto& r : base->reads) {
      EXPECT_TRUE(r.load() == 1 || r.load() >= 3) << "kept after its first read, or never";
      read_once += r.load() == 1;
    }
    EXPECT_LE(kept->kept_bytes(), budget);
    EXPECT_EQ(kept->kept_samples(), read_once);
    if (budget > 1000) {
      EXPECT_EQ(read_once, 11);
    } else if (budget == 0) {
      EXPECT_EQ(read_once, 0);
    } else {
      EXPECT_GE(read_once, 2);
      EXPECT_LE(read_once, 4);
    }
  }
}

TEST(EvaluationThreadTest, RunsEachTaskOnItsOneThreadAndRethrows) {
  const Lane lane = Lane::create("eval", c10::Device(c10::kCPU));
  const std::function<std::thread::id()> whose = [] { return std::this_thread::get_id(); };
  const std::thread::id first = detail::on_evaluation_thread(lane, whose);
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(detail::on_evaluation_thread(lane, whose), first);
  const std::function<int()> fails = []() -> int { throw std::runtime_error("metric failed"); };
  EXPECT_THROW(detail::on_evaluation_thread(lane, fails), std::runtime_error);
  EXPECT_EQ(detail::on_evaluation_thread(lane, whose), first);  // still there after a failure
}

}  // namespace
}  // namespace tandem::train
