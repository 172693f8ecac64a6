// The sweep runner and its four outputs.
#include "tandem/run/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "tandem/error.h"
#include "tandem/mode.h"
#include "tandem/run/resolve_mode.h"

namespace tandem::run {

namespace {

std::string fmt(const std::optional<double>& v, const char* spec) {
  if (!v) return "";
  char text[64];
  std::snprintf(text, sizeof text, spec, *v);
  return text;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
}  // namespace

std::vector<SweepRow> run_sweep(const SweepOptions& options,
                                const std::function<void(const SweepRow&)>& on_row) {
  std::vector<std::string> every;
  for (const Mode m : workload_modes()) every.push_back(to_string(m));
  const std::string baseline = every.front();
  // "all" (or no list) stands for every mode, in their order; duplicates run once.
  std::vector<std::string> modes;
  for (const auto& m : options.modes.empty() ? std::vector<std::string>{"all"} : options.modes)
    for (const auto& mode : m == "all" ? every : std::vector<std::string>{m})
      if (std::find(modes.begin(), modes.end(), mode) == modes.end()) modes.push_back(mode);
  TANDEM_CHECK_ARG(!options.batch_sizes.empty(), "a sweep needs at least one batch size");
  for (const auto& m : modes) {
    RunRequest probe = options.base;
    probe.mode = parse_run_mode(m);  // throws naming a bad mode before anything runs
    resolve(probe);
  }
  for (int64_t bs : options.batch_sizes)
    TANDEM_CHECK_ARG(bs > 0, "batch size ", bs, " is not valid: expected a positive number");
  modes.erase(std::remove(modes.begin(), modes.end(), baseline), modes.end());
  modes.insert(modes.begin(), baseline);

  TANDEM_CHECK_ARG(options.rounds >= 1, "rounds ", options.rounds,
                   " is not valid: expected at least 1 run of every point");

  std::vector<SweepRow> rows;
  for (int64_t bs : options.batch_sizes) {
    // One entry per mode: the rates, floors, utilizations and picks of its rounds.
    struct Runs {
      std::vector<double> rates, floors, utilizations;
      std::vector<std::string> picks, skipped;
      std::string error;
      bool refused = false;
    };
    std::vector<Runs> runs(modes.size());
    for (int round = 0; round < options.rounds; ++round)
      for (size_t m = 0; m < modes.size(); ++m) {
        Runs& run = runs[m];
        if (!run.error.empty()) continue;  // a point that failed once is reported as failed
        RunRequest o = options.base;
        o.mode = parse_run_mode(modes[m]);
        o.batch_size = bs;
        o.progress = false;
        try {
          RunReport r;
          if (!o.mode) {  // auto
            AutoReport a = run_auto(o);
            run.picks.push_back(a.resolution.decision.mode);
            r = std::move(a.report);
          } else {
            r = run_workload(o);
          }
          run.rates.push_back(r.steps_per_s);
          if (r.floor_ms > 0) run.floors.push_back(r.floor_ms);
          if (r.gpu_utilization) run.utilizations.push_back(*r.gpu_utilization);
          if (round == 0)
            for (const SkippedSample& k : r.skipped)
              run.skipped.push_back(detail::concat("sample ", k.index, ": ", first_line(k.reason)));
        } catch (const std::exception& e) {
          // TANDEM_DEBUG=1 keeps the whole message (with TORCH_SHOW_CPP_STACKTRACES=1, where
          // LibTorch threw it), as the CLI does for a failed bench.
          run.error = std::getenv("TANDEM_DEBUG") ? std::string(e.what()) : first_line(e.what());
          run.refused = dynamic_cast<const InvalidArgument*>(&e) != nullptr;
        }
        if (round + 1 == options.rounds && on_row) {
          SweepRow partial;  // progress only: the row as far as it is known
          partial.mode = modes[m];
          partial.batch_size = bs;
          partial.error = run.error;
          on_row(partial);
        }
      }
    const std::optional<double> baseline_rate = median(runs.front().rates);
    const std::optional<double> floor_ms = median(runs.front().floors);
    for (size_t m = 0; m < modes.size(); ++m) {
      const Runs& run = runs[m];
      SweepRow row;
      row.mode = modes[m];
      row.batch_size = bs;
      row.error = run.error;
      row.refused = run.refused;
      row.skipped = run.skipped;
      if (run.error.empty()) {
        row.round_rates = run.rates;
        row.steps_per_s = median(run.rates);
        row.samples_per_s = *row.steps_per_s * static_cast<double>(bs);
        row.gpu_utilization = median(run.utilizations);
        if (baseline_rate) row.speedup = *row.steps_per_s / *baseline_rate;
        if (floor_ms) row.efficiency = *row.steps_per_s * *floor_ms / 1000.0;
        // auto: its pick, or each round's where the rounds chose differently.
        const bool one_pick = std::all_of(run.picks.begin(), run.picks.end(),
                                          [&](const std::string& p) { return p == run.picks[0]; });
        const size_t shown = one_pick ? std::min<size_t>(1, run.picks.size()) : run.picks.size();
        for (size_t i = 0; i < shown; ++i) row.picked += (i ? ", " : "") + run.picks[i];
      }
      rows.push_back(row);
    }
  }
  return rows;
}

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  char line[256];
  // With several rounds a point's steps/s is their median; its range says how much they varied.
  const bool ranges = std::any_of(rows.begin(), rows.end(),
                                  [](const SweepRow& r) { return r.round_rates.size() > 1; });
  std::snprintf(line, sizeof line, "%-26s %6s %10s %11s %8s %6s %8s%s\n", "mode", "batch",
                "steps/s", "samples/s", "speedup", "eff", "GPU util",
                ranges ? "   rounds' range" : "");
  os << line;
  for (const auto& r : rows) {
    std::string mode = r.picked.empty() ? r.mode : r.mode + " (" + r.picked + ")";
    if (!r.error.empty()) {
      std::snprintf(line, sizeof line, "%-26s %6lld  failed: %s\n", mode.c_str(),
                    static_cast<long long>(r.batch_size), r.error.c_str());
    } else {
      std::string range;
      if (ranges && !r.round_rates.empty()) {
        const auto [lo, hi] = std::minmax_element(r.round_rates.begin(), r.round_rates.end());
        range = "   " + fmt(*lo, "%.2f") + " - " + fmt(*hi, "%.2f");
      }
      std::snprintf(line, sizeof line, "%-26s %6lld %10s %11s %8s %6s %8s%s\n", mode.c_str(),
                    static_cast<long long>(r.batch_size), fmt(r.steps_per_s, "%.2f").c_str(),
                    fmt(r.samples_per_s, "%.1f").c_str(), fmt(r.speedup, "%.2fx").c_str(),
                    fmt(r.efficiency, "%.2f").c_str(),
                    r.gpu_utilization ? fmt(r.gpu_utilization, "%.0f%%").c_str() : "n/a",
                    range.c_str());
    }
    os << line;
  }
  for (const auto& r : rows)
    if (!r.skipped.empty())
      os << "skipped (--skip-bad) at " << r.mode << ", batch " << r.batch_size << ": "
         << detail::count_of(static_cast<long long>(r.skipped.size()), "bad sample") << " ("
         << r.skipped.front() << (r.skipped.size() > 1 ? "; ..." : "") << ")\n";
  return os.str();
}

void check_some_point_ran(const std::vector<SweepRow>& rows) {
  const auto failed = [](const SweepRow& r) { return !r.error.empty(); };
  if (rows.empty() || !std::all_of(rows.begin(), rows.end(), failed)) return;
  const SweepRow& first = rows.front();
  const std::string what =
      detail::concat("every point of the sweep failed (the first, ", first.mode, " at batch ",
                     first.batch_size, ": ", first.error, ")");
  const bool refused =
      std::all_of(rows.begin(), rows.end(), [](const SweepRow& r) { return r.refused; });
  if (refused) throw InvalidArgument(what);
  throw Error(what);
}

std::string sweep_csv(const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  os << "mode,batch_size,steps_per_s,samples_per_s,speedup,efficiency,gpu_utilization,picked,"
        "error\n";
  for (const auto& r : rows)
    os << csv_field(r.mode) << ',' << r.batch_size << ',' << fmt(r.steps_per_s, "%.4f") << ','
       << fmt(r.samples_per_s, "%.4f") << ',' << fmt(r.speedup, "%.4f") << ','
       << fmt(r.efficiency, "%.4f") << ',' << fmt(r.gpu_utilization, "%.2f") << ','
       << csv_field(r.picked) << ',' << csv_field(r.error) << '\n';
  return os.str();
}

nlohmann::json sweep_json(const std::vector<SweepRow>& rows, const SweepOptions& options) {
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json out = {{"scenario", options.base.workload.name},
                        {"rounds", options.rounds},
                        {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    nlohmann::json j = {{"impl", "tandem"},
                        {"scenario", options.base.workload.name},
                        {"mode", r.mode},
                        {"batch_size", r.batch_size},
                        {"steps_per_s", opt(r.steps_per_s)},
                        {"samples_per_s", opt(r.samples_per_s)},
                        {"speedup", opt(r.speedup)},
                        {"efficiency", opt(r.efficiency)},
                        {"gpu_utilization", opt(r.gpu_utilization)},
                        {"round_steps_per_s", r.round_rates}};
    if (!r.picked.empty()) j["picked"] = r.picked;
    if (!r.error.empty()) j["error"] = r.error;
    if (!r.skipped.empty()) j["skipped"] = r.skipped;
    out["rows"].push_back(std::move(j));
  }
  return out;
}

std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title, bool speedup) {
  constexpr double kW = 720, kH = 420, kLeft = 70, kRight = 150, kTop = 40, kBottom = 50;
  const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  std::vector<int64_t> sizes;
  std::vector<std::string> modes;
  double ymax = 0;
  for (const auto& r : rows) {
    if (std::find(sizes.begin(), sizes.end(), r.batch_size) == sizes.end())
      sizes.push_back(r.batch_size);
    if (std::find(modes.begin(), modes.end(), r.mode) == modes.end()) modes.push_back(r.mode);
    const auto& v = speedup ? r.speedup : r.steps_per_s;
    if (v) ymax = std::max(ymax, *v);
  }
  std::sort(sizes.begin(), sizes.end());
  if (ymax <= 0) ymax = 1;
  ymax *= 1.1;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  // Batch sizes are spread evenly (they are usually powers of two): the axis is categorical.
  auto x_of = [&](int64_t bs) {
    const auto i = std::find(sizes.begin(), sizes.end(), bs) - sizes.begin();
    return kLeft + (sizes.size() == 1 ? pw / 2 : pw * i / (sizes.size() - 1));
  };
  auto y_of = [&](double v) { return kTop + ph * (1 - v / ymax); };
  std::ostringstream os;
  char buf[512];
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << kW / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
     << xml_escape(title) << "</text>\n";
  for (int i = 0; i <= 5; ++i) {  // horizontal grid and y labels
    const double v = ymax * i / 5, y = y_of(v);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>"
                  "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.*f</text>\n",
                  kLeft, y, kLeft + pw, y, kLeft - 6, y + 4, speedup ? 2 : 0, v);
    os << buf;
  }
  for (int64_t bs : sizes) {
    std::snprintf(buf, sizeof buf, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%lld</text>\n",
                  x_of(bs), kTop + ph + 18, static_cast<long long>(bs));
    os << buf;
  }
  std::snprintf(
      buf, sizeof buf,
      "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">batch size</text>\n"
      "<text x=\"16\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 16 %g)\">"
      "%s</text>\n"
      "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n",
      kLeft + pw / 2, kH - 10, kTop + ph / 2, kTop + ph / 2,
      speedup ? "speedup over serial" : "steps/s", kLeft, kTop, pw, ph);
  os << buf;
  for (size_t m = 0; m < modes.size(); ++m) {
    const char* color = kColors[m % 6];
    std::string points;
    std::string marks;
    for (int64_t bs : sizes)
      for (const auto& r : rows) {
        const auto& v = speedup ? r.speedup : r.steps_per_s;
        if (r.mode != modes[m] || r.batch_size != bs || !v) continue;
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(bs), y_of(*v));
        points += buf;
        std::snprintf(buf, sizeof buf,
                      "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s, batch "
                      "%lld: %.2f</title></circle>\n",
                      x_of(bs), y_of(*v), color, xml_escape(modes[m]).c_str(),
                      static_cast<long long>(bs), *v);
        marks += buf;
      }
    os << "<g class=\"series\" data-mode=\"" << xml_escape(modes[m]) << "\">\n"
       << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\""
       << points << "\"/>\n"
       << marks;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%g\" y=\"%g\">%s</text>\n",
                  kLeft + pw + 15, kTop + 10 + 20.0 * m, kLeft + pw + 40, kTop + 10 + 20.0 * m,
                  color, kLeft + pw + 46, kTop + 14 + 20.0 * m, xml_escape(modes[m]).c_str());
    os << buf << "</g>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace tandem::run
