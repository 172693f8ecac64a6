// The trace: valid Chrome-trace JSON, one track per lane, no overlapping intervals on a lane,
// stage names as the pipeline's. On the CPU (host intervals) and on the GPU (event intervals).
// Writing it reports every failure, even one that only the final flush sees.
#include "tandem/detail/trace.h"

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "pipeline.h"
#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace {

const std::vector<std::string> kStages{"load", "encode", "train"};

nlohmann::json traced_run(c10::Device device, PipelineMode mode, int64_t items) {
  Trace trace;
  std::vector<Stage> stages;
  for (const auto& name : kStages)
    stages.push_back({name, Lane::create("lane-" + name, device), [device](Batch& b, const Lane&) {
                        if (device.is_cuda())
                          at::cuda::sleep(20000);
                        else
                          std::this_thread::sleep_for(std::chrono::microseconds(300));
                      }});
  Pipeline p(std::move(stages), mode, Lane::create("serial", device));
  p.set_timing(2, /*device_timing_every=*/3);  // a trace times every item all the same
  p.set_trace(&trace);
  p.run(items);
  // Round-trip through text, as a viewer would read it.
  return nlohmann::json::parse(trace.to_chrome_json().dump());
}

struct Interval {
  double start, end;
  std::string name;
};

// Track name -> intervals, for events of process `pid`; checks the event fields on the way.
std::map<std::string, std::vector<Interval>> tracks_of(const nlohmann::json& trace, int pid) {
  EXPECT_TRUE(trace.contains("traceEvents"));
  std::map<std::pair<int, int>, std::string> names;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name")
      names[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"].get<std::string>();
  std::map<std::string, std::vector<Interval>> tracks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"].get<int>() != pid) continue;
    const auto key = std::make_pair(e["pid"].get<int>(), e["tid"].get<int>());
    EXPECT_TRUE(names.count(key)) << "event on an unnamed track: " << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const double ts = e["ts"].get<double>();
    tracks[names[key]].push_back({ts, ts + e["dur"].get<double>(), e["name"]});
  }
  return tracks;
}

void expect_lanes_well_formed(const nlohmann::json& trace, const std::set<std::string>& lanes,
                              int64_t timed_items) {
  auto tracks = tracks_of(trace, /*pid=*/1);
  std::set<std::string> seen;
  for (auto& [lane, intervals] : tracks) {
    seen.insert(lane);
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.start < b.start; });
    for (size_t i = 1; i < intervals.size(); ++i)
      EXPECT_LE(intervals[i - 1].end, intervals[i].start + 1e-3)
          << "overlap on lane " << lane << " at interval " << i;
    for (const auto& iv : intervals)
      EXPECT_TRUE(std::find(kStages.begin(), kStages.end(), iv.name) != kStages.end()) << iv.name;
  }
  EXPECT_EQ(seen, lanes);
  size_t total = 0;
  for (const auto& [lane, intervals] : tracks) total += intervals.size();
  EXPECT_EQ(total, kStages.size() * timed_items);
}

TEST(TraceTest, PipelinedCpuRunHasOneTrackPerLaneWithoutOverlap) {
  const auto trace = traced_run(c10::Device(c10::kCPU), PipelineMode::kPipelined, 10);
  expect_lanes_well_formed(trace, {"lane-load", "lane-encode", "lane-train"}, 8);
  const auto host = tracks_of(trace, /*pid=*/2);
  EXPECT_TRUE(host.count("host: train"));
}

TEST(TraceTest, SerialCpuRunUsesOneLane) {
  const auto trace = traced_run(c10::Device(c10::kCPU), PipelineMode::kSerial, 6);
  expect_lanes_well_formed(trace, {"serial"}, 4);
}

TEST(TraceTest, WritesAFileAViewerCanParse) {
  Trace trace;
  { HostSpan span(&trace, "host: x", "work", 3); }
  const std::string path = ::testing::TempDir() + "/tandem-trace-test.json";
  trace.write(path);
  std::ifstream in(path);
  const auto parsed = nlohmann::json::parse(in);
  EXPECT_EQ(tracks_of(parsed, 2).at("host: x").size(), 1u);
  std::remove(path.c_str());
  EXPECT_THROW(trace.write("/nonexistent-dir/t.json"), InvalidArgument);
}

// A full disk accepts the buffered write and fails only when the buffer is flushed: the
// failure must still reach the caller (it used to be reported as success).
TEST(TraceTest, AWriteThatFailsAtFlushThrows) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full on this machine";
  Trace trace;
  { HostSpan span(&trace, "host: x", "work", 3); }
  try {
    trace.write("/dev/full");
    FAIL() << "writing to /dev/full succeeded";
  } catch (const InvalidArgument& e) {
    FAIL() << "the path was valid; the write failed: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "writing the trace to '/dev/full' failed: " + std::string(std::strerror(ENOSPC)));
  }
}

TEST(TraceGpuTest, LaneTracksComeFromDeviceEvents) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const auto trace = traced_run(c10::Device(c10::kCUDA, 0), PipelineMode::kPipelined, 12);
  expect_lanes_well_formed(trace, {"lane-load", "lane-encode", "lane-train"}, 10);
}

}  // namespace
}  // namespace tandem
