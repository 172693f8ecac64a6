// EvaluationThread: every evaluation of a training run on one thread of its own.
//
// Why a thread: ATen caches cuDNN's autotuned convolution plans per thread (the v8+ API's
// benchmark cache is thread_local, since execution plans are not thread-safe across engines).
// The Trainer evaluates from the train stage's thread between steps, but the last epoch's
// evaluation comes after the pipeline's threads have ended, from the caller's thread: there it
// re-tuned every convolution, 1-2 s where the epoch before took 0.03-0.1 s (H200, ResNet-18 and
// -50, 300 images). One long-lived thread keeps the plans of the first evaluation for all.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "tandem/lane.h"

namespace tandem::train::detail {

class EvaluationThread {
 public:
  EvaluationThread() : thread_([this] { loop(); }) {}
  ~EvaluationThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  EvaluationThread(const EvaluationThread&) = delete;
  EvaluationThread& operator=(const EvaluationThread&) = delete;

  /// Runs `task` on the thread with `lane` current (its device and stream: the work is ordered
  /// on the lane as if the caller had enqueued it) and waits for it; rethrows what it throws.
  template <typename Result>
  Result run(const Lane& lane, const std::function<Result()>& task) {
    Result result{};
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      pending_ = [&] {
        try {
          LaneGuard guard(lane, "evaluate");
          result = task();
        } catch (...) {
          error = std::current_exception();
        }
      };
      changed_.notify_all();
      changed_.wait(lock, [&] { return !pending_; });
    }
    if (error) std::rethrow_exception(error);
    return result;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || pending_; });
      if (stopping_) return;
      lock.unlock();
      pending_();  // run() waits meanwhile: nobody else touches pending_
      lock.lock();
      pending_ = nullptr;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> pending_;  // set by run(), cleared once done
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace tandem::train::detail
