// Which GPU kernels a run's steps execute and how long each takes on the device: LibTorch's own
// profiler (Kineto over CUPTI), driven from C++, summed by kernel name. This is what says where a
// step's device time goes — convolutions, normalization, elementwise passes, the optimizer — so a
// change to the step can be predicted and checked kernel by kernel against another run (for
// instance the same step under torch.compile, listed by torch.profiler in Python).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::run {

/// One kernel name's launches over the profiled steps.
struct KernelTime {
  std::string name;
  int64_t count = 0;
  double total_ms = 0;  ///< device time, summed over the launches
};

/// One CUDA API function's calls from one host thread over the profiled steps (CUPTI's runtime
/// and driver records): where a thread waits on the device — a synchronisation, a synchronous
/// copy or free, a library's call that returns when its GPU work is done.
struct ApiCallTime {
  std::string name;
  uint64_t thread = 0;      ///< the host thread's id as the Chrome trace gives it (`tid`)
  std::string thread_name;  ///< its name where tandem named it (a stage, a loader worker)
  int64_t count = 0;
  double total_ms = 0;    ///< host time inside the calls, summed
  double longest_ms = 0;  ///< the longest single call
};

struct KernelProfile {
  int64_t steps = 0;                   ///< how many steps the times cover
  std::vector<KernelTime> kernels;     ///< by total time, longest first
  std::vector<ApiCallTime> api_calls;  ///< by total time, longest first
  double total_ms() const;             ///< every kernel's device time
};

/// One recorded API call, as sum_api_calls takes it.
struct ApiCallSample {
  std::string name;
  uint64_t thread = 0;
  double ms = 0;
};

/// The samples summed by (thread, name), longest total first; each row's thread named where
/// tandem named it (named_thread).
std::vector<ApiCallTime> sum_api_calls(const std::vector<ApiCallSample>& samples);

/// Starts LibTorch's profiler for CUDA activity on construction; stop() ends it and sums the
/// kernels. CUPTI records every thread's and every CUDA graph's kernels, so the lanes' work is
/// all there; the profiler's own host-side state belongs to the thread that started it, so
/// stop() must run on that thread (the destructor stops it too, dropping the result).
class KernelRecorder {
 public:
  KernelRecorder();
  ~KernelRecorder();
  KernelRecorder(const KernelRecorder&) = delete;
  KernelRecorder& operator=(const KernelRecorder&) = delete;
  /// `trace_path` not empty: also writes the profiler's Chrome trace there (every kernel, copy
  /// and API call on its stream or thread; ui.perfetto.dev opens it).
  KernelProfile stop(int64_t steps, const std::string& trace_path = "");

 private:
  bool running_ = false;
};

/// The `top` longest kernels as a table: ms per step, share, launches per step, name; then the
/// `top_api` API calls that held their threads longest.
std::string describe_kernels(const KernelProfile& profile, size_t top = 25, size_t top_api = 12);
nlohmann::json to_json(const KernelProfile& profile);

}  // namespace tandem::run
