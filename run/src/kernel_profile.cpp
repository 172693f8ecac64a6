// LibTorch's Kineto profiler driven from C++ (what torch.profiler does from Python): CUDA
// activity only, so the host-side operator records that would slow the step are not taken.
#include "tandem/run/kernel_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "tandem/detail/thread_name.h"
#include "tandem/error.h"

namespace tandem::run {

namespace {
namespace prof = torch::profiler::impl;

prof::ProfilerConfig cuda_activity_config() {
  return prof::ProfilerConfig(prof::ProfilerState::KINETO);
}

const std::set<prof::ActivityType>& cuda_activity() {
  static const std::set<prof::ActivityType> kinds{prof::ActivityType::CUDA};
  return kinds;
}
}  // namespace

double KernelProfile::total_ms() const {
  double sum = 0;
  for (const auto& k : kernels) sum += k.total_ms;
  return sum;
}

KernelRecorder::KernelRecorder() {
  torch::autograd::profiler::prepareProfiler(cuda_activity_config(), cuda_activity());
  torch::autograd::profiler::enableProfiler(cuda_activity_config(), cuda_activity());
  running_ = true;
}

KernelRecorder::~KernelRecorder() {
  if (!running_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {  // a destructor reports nothing: the run's own error is already on its way
  }
}

std::vector<ApiCallTime> sum_api_calls(const std::vector<ApiCallSample>& samples) {
  std::map<std::pair<uint64_t, std::string>, ApiCallTime> by_call;
  for (const auto& s : samples) {
    ApiCallTime& c = by_call[{s.thread, s.name}];
    c.name = s.name;
    c.thread = s.thread;
    c.count += 1;
    c.total_ms += s.ms;
    c.longest_ms = std::max(c.longest_ms, s.ms);
  }
  std::vector<ApiCallTime> out;
  for (auto& [key, c] : by_call) {
    c.thread_name = named_thread(c.thread);  // once per row, not per call
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const ApiCallTime& a, const ApiCallTime& b) {
    return a.total_ms > b.total_ms;
  });
  return out;
}

KernelProfile KernelRecorder::stop(int64_t steps, const std::string& trace_path) {
  if (!running_) throw Error("the kernel profiler was already stopped");
  running_ = false;
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  std::map<std::string, KernelTime> by_name;
  std::vector<ApiCallSample> api;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) {
      // Host-side records under CUDA activity are CUPTI's runtime (cuda*) and driver (cu*) calls.
      const std::string name = e.name();
      // The calling thread: the record's resource id, the `tid` the Chrome trace gives it (on
      // an H200 every record's startThreadId was the same, the profiler's own thread's).
      if (name.rfind("cu", 0) == 0) {
        const int64_t resource = e.deviceResourceId();
        const uint64_t thread = resource > 0 ? static_cast<uint64_t>(resource) : e.startThreadId();
        api.push_back({name, thread, static_cast<double>(e.durationNs()) / 1e6});
      }
      continue;
    }
    KernelTime& k = by_name[e.name()];
    k.name = e.name();
    k.count += 1;
    k.total_ms += static_cast<double>(e.durationNs()) / 1e6;
  }
  KernelProfile profile;
  profile.steps = steps;
  for (auto& [name, k] : by_name) profile.kernels.push_back(std::move(k));
  std::sort(profile.kernels.begin(), profile.kernels.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  profile.api_calls = sum_api_calls(api);
  return profile;
}

std::string describe_kernels(const KernelProfile& p, size_t top, size_t top_api) {
  std::ostringstream os;
  const double steps = static_cast<double>(std::max<int64_t>(p.steps, 1));
  const double total = p.total_ms();
  char line[256];
  if (p.kernels.empty()) {
    os << "GPU kernels: none ran in the " << p.steps
       << " profiled steps (a CPU run, or no CUDA activity recorded)\n";
  } else {
    std::snprintf(line, sizeof line,
                  "GPU kernels over %lld profiled steps: %.3f ms per step in %zu kinds\n",
                  static_cast<long long>(p.steps), total / steps, p.kernels.size());
    os << line;
    std::snprintf(line, sizeof line, "  %9s %6s %9s  %s\n", "ms/step", "share", "per step",
                  "kernel");
    os << line;
    for (size_t i = 0; i < p.kernels.size() && i < top; ++i) {
      const KernelTime& k = p.kernels[i];
      std::string name = k.name.size() > 100 ? k.name.substr(0, 97) + "..." : k.name;
      std::snprintf(line, sizeof line, "  %9.3f %5.1f%% %9.1f  %s\n", k.total_ms / steps,
                    total > 0 ? 100.0 * k.total_ms / total : 0.0,
                    static_cast<double>(k.count) / steps, name.c_str());
      os << line;
    }
    if (p.kernels.size() > top)
      os << "  ... " << p.kernels.size() - top << " more (--json lists all)\n";
  }
  if (p.api_calls.empty()) return os.str();
  os << "CUDA API calls over the same steps, by host thread (where threads wait on the device):\n";
  std::snprintf(line, sizeof line, "  %9s %9s %11s %20s  %s\n", "ms/step", "per step", "longest ms",
                "thread", "call");
  os << line;
  for (size_t i = 0; i < p.api_calls.size() && i < top_api; ++i) {
    const ApiCallTime& c = p.api_calls[i];
    const std::string thread =
        c.thread_name.empty() ? std::to_string(c.thread) : c.thread_name.substr(0, 20);
    std::snprintf(line, sizeof line, "  %9.3f %9.1f %11.3f %20s  %s\n", c.total_ms / steps,
                  static_cast<double>(c.count) / steps, c.longest_ms, thread.c_str(),
                  c.name.c_str());
    os << line;
  }
  if (p.api_calls.size() > top_api)
    os << "  ... " << p.api_calls.size() - top_api << " more (--json lists all)\n";
  return os.str();
}

nlohmann::json to_json(const KernelProfile& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& k : p.kernels)
    rows.push_back({{"name", k.name}, {"count", k.count}, {"total_ms", k.total_ms}});
  nlohmann::json calls = nlohmann::json::array();
  for (const auto& c : p.api_calls)
    calls.push_back({{"name", c.name},
                     {"thread", c.thread},
                     {"thread_name", c.thread_name},
                     {"count", c.count},
                     {"total_ms", c.total_ms},
                     {"longest_ms", c.longest_ms}});
  return {{"steps", p.steps}, {"total_ms", p.total_ms()}, {"kernels", rows}, {"api_calls", calls}};
}

}  // namespace tandem::run
