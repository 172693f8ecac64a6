// on_evaluation_thread: every evaluation of the process's training runs on the training's own
// kept thread, the "train" role's.
//
// Why that thread: ATen caches cuDNN's autotuned convolution plans per thread (the v8+ API's
// benchmark cache is thread_local, since execution plans are not thread-safe across engines). An
// evaluation's forward runs the model's convolutions at the training's batch shape, which the
// train role's thread tuned on the run's first steps; any other thread tunes them all again on
// its first evaluation (1-2 s for ResNet-18 and -50 on an H200, where a later evaluation of 300
// images took 0.03-0.1 s). The Trainer evaluates from the train stage's thread between steps:
// there the evaluation runs inline (the training waits for it either way); the last epoch's
// evaluation, after the pipeline's steps have ended, runs on that same kept thread, idle by then
// (tandem/detail/kept_threads.h: run_on_kept_thread).
#pragma once

#include <functional>

#include "tandem/detail/kept_threads.h"
#include "tandem/detail/lane.h"

namespace tandem::train::detail {

/// Runs `task` on the "train" role's kept thread with `lane` current (its device and stream: the
/// work is ordered on the lane as if the caller had enqueued it) and waits for it; rethrows what
/// it throws.
template <typename Result>
Result on_evaluation_thread(const Lane& lane, const std::function<Result()>& task) {
  Result result{};
  tandem::detail::run_on_kept_thread(tandem::detail::stage_role("", true), "evaluate", [&] {
    LaneGuard guard(lane, "evaluate");
    result = task();
  });
  return result;
}

}  // namespace tandem::train::detail
