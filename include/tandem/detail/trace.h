// A timeline of a run in the Chrome trace format (open it in https://ui.perfetto.dev or
// chrome://tracing): one track per lane with the device intervals of each stage, and host tracks
// for the threads that enqueue stages, the waits for ring slots and the loader's workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem {

/// One interval on one track. Times are microseconds since the trace's origin.
struct TraceSpan {
  enum class Kind { kLane, kHost };
  Kind kind;
  std::string track;  ///< lane name (kLane) or host thread name (kHost)
  std::string name;   ///< stage name, "slot wait", "batch 12", ...
  double start_us;
  double duration_us;
  int64_t item = -1;  ///< the pipeline item (step), when there is one
};

/// Collects spans from any thread.
class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  Trace() : origin_(Clock::now()) {}

  Clock::time_point origin() const { return origin_; }
  double us_since_origin(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  }
  void add(TraceSpan span);
  std::vector<TraceSpan> spans() const;

  /// {"traceEvents": [...], "displayTimeUnit": "ms"}: complete ("X") events, pid 1 for lanes
  /// and pid 2 for host threads, each track a tid named by a thread_name metadata event.
  nlohmann::json to_chrome_json() const;
  /// Writes to_chrome_json() to `path`. Throws InvalidArgument naming the path if it cannot be
  /// opened, and tandem::Error if any byte fails to reach the file (a full disk), even when
  /// only the final flush or close reports it.
  void write(const std::string& path) const;

 private:
  Clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<TraceSpan> spans_;
};

/// Adds a host span from `start` to now when it goes out of scope (no-op without a trace).
class HostSpan {
 public:
  HostSpan(Trace* trace, std::string track, std::string name, int64_t item = -1)
      : trace_(trace),
        track_(std::move(track)),
        name_(std::move(name)),
        item_(item),
        start_(Trace::Clock::now()) {}
  ~HostSpan();
  HostSpan(const HostSpan&) = delete;
  HostSpan& operator=(const HostSpan&) = delete;

 private:
  Trace* trace_;
  std::string track_, name_;
  int64_t item_;
  Trace::Clock::time_point start_;
};

}  // namespace tandem
