// Loader: exactly-once delivery, order, determinism, error propagation, clean stop.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/sample_rng.h"
#include "tandem/scenarios/seg.h"

namespace tandem {
namespace {

// Sample i = {index, 16 payload bytes derived from i}; optionally slow, optionally failing.
class IndexDataset : public Dataset {
 public:
  IndexDataset(int64_t size, int64_t fail_at = -1, int sleep_us = 0)
      : size_(size), fail_at_(fail_at), sleep_us_(sleep_us) {}
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override {
    return {{"index", {1}, at::kLong}, {"payload", {16}, at::kByte}};
  }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    ++active;
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_ * (index % 3)));
    if (index == fail_at_) {
      --active;
      throw std::runtime_error("disk on fire");
    }
    out[0].data_ptr<int64_t>()[0] = index;
    SampleRng(7, index).fill_bytes(out[1].data_ptr<uint8_t>(), 16);
    --active;
  }
  mutable std::atomic<int> active{0};

 private:
  int64_t size_, fail_at_;
  int sleep_us_;
};

std::vector<int64_t> drain(Loader& loader, int64_t* batches = nullptr) {
  std::vector<int64_t> seen;
  int64_t number = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->number, number++);
    const at::Tensor idx = b->fields[0];
    for (int64_t i = 0; i < idx.size(0); ++i) {
      EXPECT_EQ(idx[i][0].item<int64_t>(), b->indices[i]) << "batch " << b->number << " row " << i;
      seen.push_back(idx[i][0].item<int64_t>());
    }
    loader.release(*b);
  }
  if (batches) *batches = number;
  return seen;
}

TEST(LoaderTest, DeliversEveryIndexExactlyOnceInOrder) {
  auto ds = std::make_shared<IndexDataset>(1001, -1, 20);
  LoaderOptions o;
  o.batch_size = 7;
  o.workers = 4;
  o.depth = 3;
  o.drop_last = false;
  Loader loader(ds, o);
  EXPECT_EQ(loader.num_batches(), 143);
  int64_t batches = 0;
  const auto seen = drain(loader, &batches);
  EXPECT_EQ(batches, 143);
  ASSERT_EQ(seen.size(), 1001u);
  for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(seen[i], i) << "first out-of-order position";
}

TEST(LoaderTest, DropLastDropsOnlyTheShortBatch) {
  auto ds = std::make_shared<IndexDataset>(10);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  Loader loader(ds, o);
  EXPECT_EQ(drain(loader).size(), 8u);
}

TEST(LoaderTest, ShuffleIsAPermutationAndSeeded) {
  auto ds = std::make_shared<IndexDataset>(500);
  LoaderOptions o;
  o.batch_size = 10;
  o.workers = 3;
  o.shuffle = true;
  o.seed = 11;
  Loader a(ds, o), b(ds, o);
  o.seed = 12;
  Loader c(ds, o);
  const auto sa = drain(a), sb = drain(b), sc = drain(c);
  EXPECT_EQ(std::set<int64_t>(sa.begin(), sa.end()).size(), 500u);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  std::vector<int64_t> identity(500);
  for (int i = 0; i < 500; ++i) identity[i] = i;
  EXPECT_NE(sa, identity);
}

TEST(LoaderTest, ContentIsAFunctionOfTheIndexNotTheWorker) {
  auto ds = std::make_shared<SegDataset>(12, /*seed=*/3, /*image_size=*/32);
  auto collect = [&](int workers) {
    LoaderOptions o;
    o.batch_size = 3;
    o.workers = workers;
    Loader loader(ds, o);
    std::vector<at::Tensor> images, labels;
    while (auto b = loader.next()) {
      images.push_back(b->fields[0].clone());
      labels.push_back(b->fields[1].clone());
      loader.release(*b);
    }
    return std::make_pair(at::cat(images), at::cat(labels));
  };
  const auto [img1, lbl1] = collect(1);
  const auto [img4, lbl4] = collect(4);
  EXPECT_TRUE(img1.equal(img4));
  EXPECT_TRUE(lbl1.equal(lbl4));
  EXPECT_EQ(img1.scalar_type(), at::kByte);
  EXPECT_EQ(lbl1.scalar_type(), at::kLong);
  EXPECT_EQ(lbl1.min().item<int64_t>(), 0);
  EXPECT_EQ(lbl1.max().item<int64_t>(), kSegClasses - 1);
  EXPECT_GT(img1.to(at::kFloat).std().item<double>(), 50.0);  // random bytes, not zeros
  // Another seed gives other data.
  SegDataset other(12, 4, 32);
  std::vector<at::Tensor> out{at::empty({3, 32, 32}, at::kByte), at::empty({32, 32}, at::kLong)};
  other.get(0, out);
  EXPECT_FALSE(out[0].equal(img1[0]));
}

TEST(LoaderTest, WorkerErrorReachesTheCallerWithTheSampleIndex) {
  auto ds = std::make_shared<IndexDataset>(100, /*fail_at=*/37);
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = 3;
  Loader loader(ds, o);
  for (int i = 0; i < 7; ++i) {  // batches 0..6 hold samples 0..34
    auto b = loader.next();
    ASSERT_TRUE(b.has_value());
    loader.release(*b);
  }
  try {
    loader.next();
    FAIL() << "expected a LoaderError for sample 37";
  } catch (const LoaderError& e) {
    EXPECT_NE(std::string(e.what()).find("sample 37"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos) << e.what();
  }
}

TEST(LoaderTest, AHeldSlotIsNotOverwritten) {
  auto ds = std::make_shared<IndexDataset>(40);
  LoaderOptions o;
  o.batch_size = 2;
  o.workers = 4;
  o.depth = 2;
  Loader loader(ds, o);
  auto b0 = loader.next();
  auto b1 = loader.next();
  ASSERT_TRUE(b0 && b1);
  loader.release(*b1);  // frees slot 1 only; batch 2 needs slot 0, still held
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(b0->fields[0][0][0].item<int64_t>(), 0);
  EXPECT_EQ(b0->fields[0][1][0].item<int64_t>(), 1);
  loader.release(*b0);
  auto b2 = loader.next();
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->fields[0][0][0].item<int64_t>(), 4);
  loader.release(*b2);
}

TEST(LoaderTest, StopsCleanlyMidEpoch) {
  auto ds = std::make_shared<IndexDataset>(1000000, -1, 200);
  {
    LoaderOptions o;
    o.batch_size = 8;
    o.workers = 6;
    o.depth = 3;
    Loader loader(ds, o);
    auto b = loader.next();
    ASSERT_TRUE(b);
    loader.release(*b);
    b = loader.next();
    ASSERT_TRUE(b);  // held, not released: workers are blocked on full slots
    const auto start = std::chrono::steady_clock::now();
    loader.stop();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_FALSE(loader.next().has_value());
  }
  EXPECT_EQ(ds->active.load(), 0);  // no worker is still inside get()
}

TEST(LoaderTest, RejectsBadOptions) {
  auto ds = std::make_shared<IndexDataset>(10);
  LoaderOptions o;
  o.batch_size = 0;
  EXPECT_THROW(Loader(ds, o), InvalidArgument);
  o.batch_size = 2;
  o.workers = 0;
  EXPECT_THROW(Loader(ds, o), InvalidArgument);
}

}  // namespace
}  // namespace tandem
