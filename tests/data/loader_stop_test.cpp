// A stop request ends a loader's wait within a poll even while a worker is stuck inside a sample
// (a read on a hung network mount), naming that sample; destroying the loader then leaves the
// stuck worker behind instead of joining it forever, and the worker, once free, touches nothing
// of the loader.
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "fixtures.h"
#include "tandem/error.h"
#include "tandem/loader.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Blocks in get() of sample `stuck` until released, as a read on a hung mount would; every
// other sample is filled at once. The gate is shared, so the test can free a worker the loader
// has left behind after the loader itself is gone.
struct Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  std::atomic<int> inside{0};  // get() calls of the stuck sample now running
};

class StuckDataset : public Dataset {
 public:
  StuckDataset(int64_t stuck, std::shared_ptr<Gate> gate) : stuck_(stuck), gate_(std::move(gate)) {}
  int64_t size() const override { return 16; }
  std::vector<FieldSpec> fields() const override { return {{"x", {4}, at::kFloat}}; }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    out[0].fill_(static_cast<double>(index) + 0.5);
    if (index != stuck_) return;
    ++gate_->inside;
    std::unique_lock<std::mutex> lock(gate_->mutex);
    gate_->opened.wait(lock, [&] { return gate_->open; });
    --gate_->inside;
  }
  std::string sample_source(int64_t index) const override {
    return "hung/mount/" + std::to_string(index) + ".jpg";
  }

 private:
  int64_t stuck_;
  std::shared_ptr<Gate> gate_;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(LoaderStopTest, AStopEndsTheWaitForAStuckWorkerAndItsLoader) {
  auto gate = std::make_shared<Gate>();
  std::atomic<int> stop{0};
  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 2;
  options.depth = 2;
  options.pin_memory = false;
  options.cancel = &stop;
  std::optional<Loader> loader;
  loader.emplace(std::make_shared<StuckDataset>(3, gate), options);  // batch 1 holds sample 3

  auto first = loader->next();  // batch 0 is fine
  ASSERT_TRUE(first.has_value());
  EXPECT_FLOAT_EQ(first->fields[0][1][0].item<float>(), 1.5f);
  loader->release(*first);

  // next() waits for batch 1; a stop (as a signal handler sets it) ends the wait within a poll.
  auto open_gate = [&] {
    std::lock_guard<std::mutex> lock(gate->mutex);
    gate->open = true;
    gate->opened.notify_all();
  };
  Clock::time_point stopped_at, returned_at;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped_at = Clock::now();
    stop = SIGTERM;
  });
  std::string error;
  data::testing::expect_returns_within(
      10,
      [&] {
        try {
          loader->next();
        } catch (const LoaderError& e) {
          error = e.what();
        }
        returned_at = Clock::now();
      },
      open_gate);  // the wait ignored the stop: free the worker so the test ends
  stopper.join();
  EXPECT_LT(std::chrono::duration<double>(returned_at - stopped_at).count(), 1.0);
  EXPECT_NE(error.find("stop requested while waiting for batch 1"), std::string::npos) << error;
  EXPECT_NE(error.find("on sample 3 ('hung/mount/3.jpg') for "), std::string::npos) << error;
  EXPECT_EQ(gate->inside.load(), 1);

  // Destruction gives the stuck worker kLoaderStopGrace, then leaves it behind.
  const Clock::time_point destroying = Clock::now();
  data::testing::expect_returns_within(
      10, [&] { loader.reset(); }, open_gate);
  const double took = seconds_since(destroying);
  EXPECT_GE(took, 0.9 * std::chrono::duration<double>(kLoaderStopGrace).count());
  EXPECT_LT(took, std::chrono::duration<double>(kLoaderStopGrace).count() + 2.0);
  EXPECT_EQ(gate->inside.load(), 1);  // still stuck, now detached

  // Freed after its loader is gone, the worker returns without touching it (a crash or a
  // sanitizer report otherwise) and its dataset lives until then.
  open_gate();
  const Clock::time_point freed = Clock::now();
  while (gate->inside.load() != 0 && seconds_since(freed) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(gate->inside.load(), 0);
}

TEST(LoaderStopTest, WithoutAStopRequestAWaitIsUnchanged) {
  // A slow worker is not a stuck one: no cancel flag set, the batch comes when it is filled.
  auto gate = std::make_shared<Gate>();
  std::atomic<int> stop{0};
  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 1;
  options.pin_memory = false;
  options.cancel = &stop;
  Loader loader(std::make_shared<StuckDataset>(1, gate), options);
  std::thread opener([&] {
    std::this_thread::sleep_for(3 * kLoaderCancelPoll);
    std::lock_guard<std::mutex> lock(gate->mutex);
    gate->open = true;
    gate->opened.notify_all();
  });
  auto batch = loader.next();
  opener.join();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->indices, (std::vector<int64_t>{0, 1}));
  loader.release(*batch);
  int64_t batches = 1;
  while (auto b = loader.next()) {
    loader.release(*b);
    ++batches;
  }
  EXPECT_EQ(batches, 8);
}

}  // namespace
}  // namespace tandem
