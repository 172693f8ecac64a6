// A one-line progress report for long runs ("step 45/110  312.4 steps/s  ETA 0.2 s") on stderr,
// redrawn in place at most ten times a second, and only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tandem::run {

class Progress {
 public:
  /// Enabled when `enabled` and stderr is a terminal.
  Progress(std::string label, int64_t total, bool enabled = true);
  ~Progress();
  /// `done` steps of `total` are finished. Call from one thread.
  void update(int64_t done);
  /// Clears the line.
  void finish();
  bool enabled() const { return enabled_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_, last_draw_;
};

}  // namespace tandem::run
