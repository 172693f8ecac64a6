// The Chrome-trace writer: spans collected from any thread, written as one JSON file.
#include "tandem/detail/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "tandem/error.h"

namespace tandem {

void Trace::add(TraceSpan span) {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back(std::move(span));
}

std::vector<TraceSpan> Trace::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

nlohmann::json Trace::to_chrome_json() const {
  const auto spans = this->spans();
  constexpr int kLanePid = 1, kHostPid = 2;
  std::map<std::pair<int, std::string>, int> tids;  // (pid, track) -> tid, in first-seen order
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", kLanePid},
                    {"tid", 0},
                    {"args", {{"name", "lanes (device time)"}}}});
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", kHostPid},
                    {"tid", 0},
                    {"args", {{"name", "host threads"}}}});
  for (const auto& s : spans) {
    const int pid = s.kind == TraceSpan::Kind::kLane ? kLanePid : kHostPid;
    auto [it, inserted] =
        tids.emplace(std::make_pair(pid, s.track), static_cast<int>(tids.size()) + 1);
    if (inserted)
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", pid},
                        {"tid", it->second},
                        {"args", {{"name", s.track}}}});
    nlohmann::json e = {{"ph", "X"},           {"name", s.name},    {"cat", s.track},
                        {"pid", pid},          {"tid", it->second}, {"ts", s.start_us},
                        {"dur", s.duration_us}};
    if (s.item >= 0) e["args"] = {{"step", s.item}};
    events.push_back(std::move(e));
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void Trace::write(const std::string& path) const {
  const std::string text = to_chrome_json().dump() + "\n";
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file)
    throw InvalidArgument("trace path '" + path + "' cannot be written: " + std::strerror(errno));
  // A full disk (or /dev/full) may accept the buffered write and fail only when the buffer is
  // flushed or the file closed: each step is checked, and errno read before the next call.
  int error = 0;
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size() || std::fflush(file) != 0)
    error = errno ? errno : EIO;
  if (std::fclose(file) != 0 && error == 0) error = errno ? errno : EIO;
  if (error != 0)
    throw Error("writing the trace to '" + path + "' failed: " + std::strerror(error));
}

HostSpan::~HostSpan() {
  if (!trace_) return;
  const auto end = Trace::Clock::now();
  trace_->add({TraceSpan::Kind::kHost, std::move(track_), std::move(name_),
               trace_->us_since_origin(start_),
               std::chrono::duration<double, std::micro>(end - start_).count(), item_});
}

}  // namespace tandem
