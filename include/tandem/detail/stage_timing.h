// Where the time of a run's steps went, per stage (Runner::timing): what the run layer's
// reports, the trainer and a user's program read after a run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

/// One stage over the timed steps: host milliseconds spent enqueuing it per step, and device
/// milliseconds between its start and end events on its lane (CUDA only; the start event fires
/// once the lane is free and the handoff's wait is satisfied).
struct StageTimes {
  std::string name;
  std::string lane;
  double host_ms_per_item = 0;
  double device_ms_per_item = 0;  ///< NaN without CUDA; the mean over the sampled steps
};

struct StageTiming {
  std::vector<StageTimes> stages;
  /// Host milliseconds per step spent blocked waiting for a ring slot (the device is behind:
  /// the host is not the bottleneck).
  double slot_wait_ms_per_item = 0;
  int64_t items = 0;                ///< timed steps
  int64_t device_timing_every = 1;  ///< device time sampled on one timed step in every n
};

}  // namespace tandem
