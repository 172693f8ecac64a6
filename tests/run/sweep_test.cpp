// Sweep outputs on given rows: CSV header and rows, table, JSON, and a well-formed SVG with one
// series per mode.
#include "tandem/run/sweep.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "tandem/error.h"
#include "tandem/workloads/registry.h"

namespace tandem::run {
namespace {

std::vector<SweepRow> sample_rows() {
  std::vector<SweepRow> rows;
  for (int64_t bs : {8, 32, 128}) {
    SweepRow serial{"serial", bs, 300.0 / bs * 8, 300.0 * 8, 1.0, 0.8, 90.0, "", "", {}, false, {}};
    SweepRow pipelined{"pipelined", bs, 360.0 / bs * 8, 360.0 * 8, 1.2, 0.97, std::nullopt, "",
                       "",          {}, false,          {}};
    rows.push_back(serial);
    rows.push_back(pipelined);
  }
  SweepRow failed;
  failed.mode = "auto";
  failed.batch_size = 8;
  failed.error = "out of memory, \"really\"";
  rows.push_back(failed);
  return rows;
}

TEST(SweepTest, MedianOfOddAndEvenCounts) {
  EXPECT_FALSE(median({}).has_value());
  EXPECT_DOUBLE_EQ(*median({5.0}), 5.0);
  EXPECT_DOUBLE_EQ(*median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(*median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

// Three rounds of two modes on the CPU (mlp, one row per step: fast): every point keeps each
// round's rate and reports their median; speedups are against the baseline's median.
TEST(SweepTest, RoundsReportTheMedianOfFreshRuns) {
  SweepOptions o;
  o.base.workload = find_reference_workload("mlp");
  o.base.device = "cpu";
  o.base.steps = 2;
  o.base.warmup = 0;
  o.base.gpu_monitor = false;
  o.modes = {"serial", "graphed"};
  o.batch_sizes = {1};
  o.rounds = 3;
  std::vector<std::string> done;
  const auto rows = run_sweep(o, [&](const SweepRow& r) { done.push_back(r.mode); });
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(done, (std::vector<std::string>{"serial", "graphed"}));  // once per point
  for (const auto& r : rows) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.round_rates.size(), 3u) << r.mode;
    EXPECT_DOUBLE_EQ(*r.steps_per_s, *median(r.round_rates)) << r.mode;
    EXPECT_DOUBLE_EQ(*r.samples_per_s, *r.steps_per_s) << r.mode;  // batch size 1
  }
  EXPECT_DOUBLE_EQ(*rows[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(*rows[1].speedup, *rows[1].steps_per_s / *rows[0].steps_per_s);
  EXPECT_NE(sweep_table(rows).find("rounds' range"), std::string::npos);
  const auto j = sweep_json(rows, o);
  EXPECT_EQ(j["rounds"], 3);
  EXPECT_EQ(j["rows"][1]["round_steps_per_s"].size(), 3u);
}

TEST(SweepTest, ZeroRoundsIsANamedError) {
  SweepOptions o;
  o.base.workload = find_reference_workload("mlp");
  o.base.device = "cpu";
  o.batch_sizes = {1};
  o.rounds = 0;
  try {
    run_sweep(o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rounds 0 is not valid"), std::string::npos) << e.what();
  }
}

TEST(SweepTest, CsvHasAHeaderAndOneLinePerRow) {
  const std::string csv = sweep_csv(sample_rows());
  std::istringstream in(csv);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 8u);
  EXPECT_EQ(lines[0],
            "mode,batch_size,steps_per_s,samples_per_s,speedup,efficiency,gpu_utilization,"
            "picked,error");
  EXPECT_EQ(lines[1], "serial,8,300.0000,2400.0000,1.0000,0.8000,90.00,,");
  EXPECT_EQ(lines[2].rfind("pipelined,8,360.0000,", 0), 0u);
  EXPECT_NE(lines[2].find(",,,"), std::string::npos);  // no utilization, no pick, no error
  EXPECT_EQ(lines[7], "auto,8,,,,,,,\"out of memory, \"\"really\"\"\"");
}

TEST(SweepTest, TableShowsEveryRowAndFailures) {
  const std::string table = sweep_table(sample_rows());
  EXPECT_NE(table.find("steps/s"), std::string::npos);
  EXPECT_NE(table.find("1.20x"), std::string::npos);
  EXPECT_NE(table.find("failed: out of memory"), std::string::npos);
  EXPECT_NE(table.find("n/a"), std::string::npos);
}

TEST(SweepTest, TheSamplesSkipBadLeftOutAreNamedInTheTableAndTheJson) {
  std::vector<SweepRow> rows = sample_rows();
  rows[1].skipped = {"sample 3: b/fifo.jpg: not a regular file: a named pipe", "sample 9: x"};
  EXPECT_NE(sweep_table(rows).find("skipped (--skip-bad) at pipelined, batch 8: 2 bad samples "
                                   "(sample 3: b/fifo.jpg: not a regular file: a named pipe; "
                                   "...)"),
            std::string::npos)
      << sweep_table(rows);
  SweepOptions o;
  o.base.workload = find_reference_workload("seg");
  const auto j = sweep_json(rows, o);
  EXPECT_EQ(j["rows"][1]["skipped"].size(), 2u);
  EXPECT_FALSE(j["rows"][0].contains("skipped"));
}

TEST(SweepTest, ASweepWhosePointsAllFailedIsAnErrorNamingTheFirst) {
  std::vector<SweepRow> rows = sample_rows();
  EXPECT_NO_THROW(check_some_point_ran(rows));  // one failed point among others: a sweep
  for (SweepRow& r : rows) r.error = "stage 'load' failed: b/fifo.jpg: a named pipe";
  try {
    check_some_point_ran(rows);
    FAIL() << "no error";
  } catch (const InvalidArgument&) {
    FAIL() << "a run's failure is not bad input";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every point of the sweep failed (the first, serial at "
                                         "batch 8: stage 'load' failed: b/fifo.jpg"),
              std::string::npos)
        << e.what();
  }
  for (SweepRow& r : rows) r.refused = true;  // each failed on its input: exit 2
  EXPECT_THROW(check_some_point_ran(rows), InvalidArgument);
}

TEST(SweepTest, JsonRowsCarryTheResultShape) {
  SweepOptions o;
  o.base.workload = find_reference_workload("seg");
  const auto j = sweep_json(sample_rows(), o);
  ASSERT_EQ(j["rows"].size(), 7u);
  EXPECT_EQ(j["rows"][1]["mode"], "pipelined");
  EXPECT_EQ(j["rows"][1]["impl"], "tandem");
  EXPECT_DOUBLE_EQ(j["rows"][1]["steps_per_s"].get<double>(), 360.0);
  EXPECT_TRUE(j["rows"][1]["gpu_utilization"].is_null());
  EXPECT_EQ(j["rows"][6]["error"], "out of memory, \"really\"");
}

TEST(SweepTest, SvgIsWellFormedWithOneSeriesPerMode) {
  const std::string svg = sweep_svg(sample_rows(), "seg <H200> & friends");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("seg &lt;H200&gt; &amp; friends"), std::string::npos);
  // Tags balance: every opened <g>, <text>, <circle>, <svg> is closed.
  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t p = svg.find(s); p != std::string::npos; p = svg.find(s, p + 1)) ++n;
    return n;
  };
  for (const char* tag : {"g", "text", "circle", "svg"})
    EXPECT_EQ(count(std::string("<") + tag + " ") + count(std::string("<") + tag + ">"),
              count(std::string("</") + tag + ">"))
        << tag;
  const std::regex series("<g class=\"series\" data-mode=\"([a-z]+)\">");
  std::vector<std::string> modes;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), series); it != std::sregex_iterator();
       ++it)
    modes.push_back((*it)[1]);
  EXPECT_EQ(modes, (std::vector<std::string>{"serial", "pipelined", "auto"}));
  // The serial series has a point for each of the three batch sizes.
  const auto start = svg.find("data-mode=\"serial\"");
  const auto points = svg.substr(svg.find("points=\"", start) + 8);
  EXPECT_EQ(std::count(points.begin(), points.begin() + points.find('"'), ','), 3);
}

}  // namespace
}  // namespace tandem::run
