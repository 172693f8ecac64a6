// Loader: exactly-once delivery, order, determinism, error propagation, clean stop, and the
// bounds on its options (workers, depth, the ring's memory) checked before anything is built.
#include "tandem/loader.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "tandem/detail/sample_rng.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// Sample i = {index, 16 payload bytes derived from i}; optionally slow, optionally failing.
class IndexDataset : public Dataset {
 public:
  IndexDataset(int64_t size, int64_t fail_at = -1, int sleep_us = 0, uint64_t seed = 7)
      : size_(size), fail_at_(fail_at), sleep_us_(sleep_us), seed_(seed) {}
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override {
    return {{"index", {1}, at::kLong}, {"payload", {16}, at::kByte}};
  }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    ++active;
    ++loaded;
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_ * (index % 3)));
    if (index == fail_at_) {
      --active;
      throw std::runtime_error("disk on fire");
    }
    out[0].data_ptr<int64_t>()[0] = index;
    SampleRng(seed_, index).fill_bytes(out[1].data_ptr<uint8_t>(), 16);
    --active;
  }
  mutable std::atomic<int> active{0};
  mutable std::atomic<int64_t> loaded{0};  // get() calls begun

 private:
  int64_t size_, fail_at_;
  int sleep_us_;
  uint64_t seed_;
};

// Records each sample's draw key: {index, seed, position}.
class DrawKeyDataset : public Dataset {
 public:
  explicit DrawKeyDataset(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override { return {{"key", {3}, at::kLong}}; }
  void get(int64_t, const std::vector<at::Tensor>&) const override {
    throw std::logic_error("the loader calls get_drawn_sample");
  }
  void get_drawn_sample(int64_t index, const SampleDraw& draw,
                        std::vector<at::Tensor>& out) const override {
    int64_t* k = out[0].data_ptr<int64_t>();
    k[0] = index;
    k[1] = static_cast<int64_t>(draw.seed);
    k[2] = static_cast<int64_t>(draw.position);
  }

 private:
  int64_t size_;
};

TEST(LoaderTest, EachSampleDrawsFromItsPositionInTheStreamWhicheverWorkerFillsIt) {
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = 3;
  o.shuffle = true;
  o.seed = 3;
  o.draw_seed = 11;
  o.first_position = 100;
  Loader loader(std::make_shared<DrawKeyDataset>(23), o);
  int64_t position = 100;
  while (auto b = loader.next()) {
    const at::Tensor k = b->fields[0];
    for (int64_t i = 0; i < k.size(0); ++i) {
      EXPECT_EQ(k[i][0].item<int64_t>(), b->indices[i]);
      EXPECT_EQ(k[i][1].item<int64_t>(), 11);
      EXPECT_EQ(k[i][2].item<int64_t>(), position++) << "batch " << b->number << " row " << i;
    }
    loader.release(*b);
  }
  EXPECT_EQ(position, 120);  // four full batches (drop_last)
}

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

TEST(LoaderTest, PassesRepeatTheOrderEachCutIntoBatchesOfItsOwn) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 3;
  o.shuffle = true;
  o.seed = 3;
  o.drop_last = false;
  Loader once(std::make_shared<IndexDataset>(10), o);
  const std::vector<int64_t> order = drain(once);
  ASSERT_EQ(order.size(), 10u);

  o.passes = 3;
  Loader loader(std::make_shared<IndexDataset>(10), o);
  EXPECT_EQ(loader.batches_per_pass(), 3);
  EXPECT_EQ(loader.num_batches(), 9);
  std::vector<int64_t> sizes, seen;
  while (auto b = loader.next()) {
    sizes.push_back(static_cast<int64_t>(b->indices.size()));
    seen.insert(seen.end(), b->indices.begin(), b->indices.end());
    loader.release(*b);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2, 4, 4, 2, 4, 4, 2}));  // no batch spans two
  std::vector<int64_t> thrice;
  for (int p = 0; p < 3; ++p) thrice.insert(thrice.end(), order.begin(), order.end());
  EXPECT_EQ(seen, thrice);

  // Draw keys run on across passes: a pass's samples draw anew.
  LoaderOptions d;
  d.batch_size = 3;
  d.workers = 2;
  d.drop_last = false;
  d.passes = 2;
  d.first_position = 50;
  Loader drawn(std::make_shared<DrawKeyDataset>(5), d);
  std::vector<int64_t> positions;
  while (auto b = drawn.next()) {
    for (int64_t i = 0; i < b->fields[0].size(0); ++i)
      positions.push_back(b->fields[0][i][2].item<int64_t>());
    drawn.release(*b);
  }
  EXPECT_EQ(positions, (std::vector<int64_t>{50, 51, 52, 53, 54, 55, 56, 57, 58, 59}));
}

TEST(LoaderTest, APausedLoaderStartsNoSampleUntilResumed) {
  auto ds = std::make_shared<IndexDataset>(400, -1, 200);  // up to 0.4 ms a sample
  LoaderOptions o;
  o.batch_size = 50;
  o.workers = 3;
  o.depth = 8;
  o.drop_last = false;
  Loader loader(ds, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the workers are mid-batch
  loader.pause();
  // A sample begun before the pause finishes; none begins after it.
  while (ds->active > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t at_pause = ds->loaded;
  EXPECT_LT(at_pause, 400);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ds->loaded, at_pause) << "samples loaded while paused";
  loader.resume();
  const std::vector<int64_t> seen = drain(loader);
  ASSERT_EQ(seen.size(), 400u);
  for (int64_t i = 0; i < 400; ++i) ASSERT_EQ(seen[i], i);

  // stop() ends a pause: a paused loader is destroyed without hanging.
  Loader paused(ds, o);
  paused.pause();
  paused.stop();
  EXPECT_FALSE(paused.next().has_value());
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

TEST(LoaderTest, ExplicitIndicesAreVisitedInTheirOrderRepeatsIncluded) {
  auto ds = std::make_shared<IndexDataset>(20);
  LoaderOptions o;
  o.batch_size = 3;
  o.workers = 2;
  o.drop_last = false;
  o.shuffle = true;  // overridden by the explicit order
  o.indices = {7, 3, 3, 19, 0, 12, 5};
  Loader loader(ds, o);
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(drain(loader), o.indices);
  o.indices = {4, 20};
  try {
    Loader bad(ds, o);
    FAIL() << "an index past the dataset was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "loader index 20 is not valid: expected 0 to 19 (the dataset has 20 "
                 "samples)");
  }
}

TEST(LoaderTest, ContentIsAFunctionOfTheIndexNotTheWorker) {
  auto collect = [](std::shared_ptr<const Dataset> ds, int workers) {
    LoaderOptions o;
    o.batch_size = 3;
    o.workers = workers;
    Loader loader(std::move(ds), o);
    std::vector<at::Tensor> payloads;
    while (auto b = loader.next()) {
      payloads.push_back(b->fields[1].clone());
      loader.release(*b);
    }
    return at::cat(payloads);
  };
  auto ds = std::make_shared<IndexDataset>(60, -1, /*sleep_us=*/50);  // workers finish unordered
  const at::Tensor one = collect(ds, 1), four = collect(ds, 4);
  EXPECT_EQ(one.sizes(), (std::vector<int64_t>{60, 16}));
  EXPECT_TRUE(one.equal(four));
  EXPECT_GT(one.to(at::kFloat).std().item<double>(), 50.0);  // random bytes, not zeros
  // Another seed gives other data.
  EXPECT_FALSE(one.equal(collect(std::make_shared<IndexDataset>(60, -1, 0, /*seed=*/8), 2)));
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

// The message of the InvalidArgument that constructing a Loader throws; "" if none.
std::string loader_error(std::shared_ptr<const Dataset> ds, const LoaderOptions& o) {
  try {
    Loader loader(std::move(ds), o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(LoaderTest, RejectsBadOptionsNamingTheValue) {
  auto ds = std::make_shared<IndexDataset>(10);
  LoaderOptions o;
  o.batch_size = 0;
  EXPECT_EQ(loader_error(ds, o),
            "batch size 0 is not valid: expected a positive number of samples");
  o.batch_size = 2;
  for (const int workers : {0, -3, 1025, 100000}) {
    o.workers = workers;
    EXPECT_EQ(loader_error(ds, o), "worker count " + std::to_string(workers) +
                                       " is not valid: expected 1 to 1024 loader worker threads");
  }
  o.workers = 2;
  for (const int depth : {0, 4097}) {
    o.depth = depth;
    EXPECT_EQ(loader_error(ds, o), "loader depth " + std::to_string(depth) +
                                       " is not valid: expected 1 to 4096 host slots");
  }
  o.depth = 2;
  for (const int nice : {-1, 20}) {
    o.worker_nice = nice;
    EXPECT_EQ(loader_error(ds, o), "loader worker nice value " + std::to_string(nice) +
                                       " is not valid: expected 0 to 19 (0: the process's "
                                       "priority)");
  }
  o.worker_nice = kMaxNice;
  o.passes = 0;
  EXPECT_EQ(loader_error(ds, o), "loader pass count 0 is not valid: expected >= 1");
  o.passes = 1;
  o.workers = kMaxLoaderWorkers;  // the bounds themselves are valid
  o.depth = 1;
  EXPECT_EQ(loader_error(ds, o), "");
}

// Each sample is the nice value of the thread that loaded it.
class NiceOfLoaderDataset : public Dataset {
 public:
  int64_t size() const override { return 12; }
  std::vector<FieldSpec> fields() const override { return {{"nice", {1}, at::kInt}}; }
  void get(int64_t, const std::vector<at::Tensor>& out) const override {
    errno = 0;
    const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
    out[0].data_ptr<int32_t>()[0] = errno == 0 ? nice : -100;
  }
};

TEST(LoaderTest, WorkersRunAtTheirNiceValueAndTheConsumerKeepsItsOwn) {
  errno = 0;
  const int consumer = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  ASSERT_EQ(errno, 0);
  for (const int nice : {0, 7}) {
    LoaderOptions o;
    o.batch_size = 3;
    o.workers = 2;
    o.worker_nice = nice;
    Loader loader(std::make_shared<NiceOfLoaderDataset>(), o);
    int64_t samples = 0;
    while (auto batch = loader.next()) {
      const at::Tensor seen = batch->fields[0];
      for (int64_t i = 0; i < seen.size(0); ++i, ++samples)
        EXPECT_EQ(seen[i][0].item<int32_t>(), std::max(consumer, nice))
            << "sample " << samples << " with worker_nice " << nice;
      loader.release(*batch);
    }
    EXPECT_EQ(samples, 12);
  }
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))), consumer);
}

// Fields as large as declared, but never allocated: get() is never called, since the loader must
// refuse the ring before it allocates a slot or starts a worker.
class HugeDataset : public Dataset {
 public:
  explicit HugeDataset(std::vector<FieldSpec> fields) : fields_(std::move(fields)) {}
  int64_t size() const override { return 1000; }
  std::vector<FieldSpec> fields() const override { return fields_; }
  void get(int64_t, const std::vector<at::Tensor>&) const override {
    throw std::logic_error("a sample of a ring that does not fit was loaded");
  }

 private:
  std::vector<FieldSpec> fields_;
};

TEST(LoaderTest, SampleBytesSumsEveryFieldsElements) {
  EXPECT_EQ(sample_bytes({}), 0);
  EXPECT_EQ(sample_bytes({{"image", {3, 256, 256}, at::kByte},
                          {"label", {}, at::kLong},
                          {"mask", {256, 256}, at::kFloat}}),
            3 * 256 * 256 + 8 + 256 * 256 * 4);
  EXPECT_EQ(sample_bytes({{"empty", {0, 1 << 30}, at::kFloat}}), 0);
  // Beyond int64: saturates instead of wrapping around to a small size.
  EXPECT_EQ(sample_bytes({{"vast", {1LL << 40, 1LL << 40}, at::kDouble}}),
            std::numeric_limits<int64_t>::max());
  EXPECT_THROW(sample_bytes({{"bad", {4, -1}, at::kFloat}}), InvalidArgument);
}

TEST(LoaderTest, ARingLargerThanHalfOfMemoryIsRefusedBeforeAllocation) {
  // 1 TiB per sample: no machine holds half a ring of them.
  const std::vector<FieldSpec> huge{{"volume", {1 << 20, 1 << 18}, at::kFloat}};
  ASSERT_EQ(sample_bytes(huge), 1LL << 40);
  LoaderOptions o;
  o.batch_size = 8192;
  o.workers = 8;
  o.depth = 10;
  const std::string what = loader_error(std::make_shared<HugeDataset>(huge), o);
  EXPECT_EQ(what.rfind("the loader's ring of 10 slots x batch 8192 x 1.0 TiB per sample = 80.0 "
                       "PiB exceeds half of this machine's memory (",
                       0),
            0u)
      << what;
  EXPECT_NE(what.find("lower the batch size"), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  // The same check, before any dataset exists (as a runner makes it).
  EXPECT_THROW(check_ring_fits(10, 8192, 1LL << 40), InvalidArgument);
  EXPECT_THROW(check_ring_fits(4096, 1LL << 40, std::numeric_limits<int64_t>::max()),
               InvalidArgument);  // a product beyond int64 still fails
  // A ring of ordinary size passes: 6 slots x 64 samples x 192 KiB = 72 MiB.
  EXPECT_NO_THROW(check_ring_fits(6, 64, 3 * 256 * 256));
}

}  // namespace
}  // namespace tandem
