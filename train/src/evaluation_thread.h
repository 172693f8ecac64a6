// on_evaluation_thread: every evaluation of the process's training runs on one kept thread.
//
// Why a thread: ATen caches cuDNN's autotuned convolution plans per thread (the v8+ API's
// benchmark cache is thread_local, since execution plans are not thread-safe across engines).
// The Trainer evaluates from the train stage's thread between steps, but the last epoch's
// evaluation comes after the pipeline's steps have ended, from the caller's thread: there it
// re-tuned every convolution, 1-2 s where the epoch before took 0.03-0.1 s (H200, ResNet-18 and
// -50, 300 images). The "evaluate" role's kept thread (tandem/detail/kept_threads.h) keeps the
// plans of the first evaluation for every later one, of this run and of the next.
#pragma once

#include <functional>

#include "tandem/detail/kept_threads.h"
#include "tandem/detail/lane.h"

namespace tandem::train::detail {

/// Runs `task` on the "evaluate" kept thread with `lane` current (its device and stream: the
/// work is ordered on the lane as if the caller had enqueued it) and waits for it; rethrows what
/// it throws.
template <typename Result>
Result on_evaluation_thread(const Lane& lane, const std::function<Result()>& task) {
  Result result{};
  tandem::detail::start_on_kept_thread("evaluate", "evaluate", [&] {
    LaneGuard guard(lane, "evaluate");
    result = task();
  }).get();
  return result;
}

}  // namespace tandem::train::detail
