// Output of the cuDNN fusion probe: the text table on stderr and the JSON document, with the per-pattern
// sums and fused-minus-plain differences both report.
#include "common.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fusion_probe {

namespace {

std::string json_escape(const std::string& s) {
    std::string out;
    out.reserve(s.size() + 8);
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out;
}

std::string jstr(const std::string& s) { return "\"" + json_escape(s) + "\""; }
std::string jstr_or_null(const std::string& s) { return s.empty() ? "null" : jstr(s); }
std::string jbool(bool b) { return b ? "true" : "false"; }

const char* kPatternNames[] = {
    "A conv_fprop",
    "B conv_fprop + genstats",
    "C scale-bias-relu + conv_fprop + genstats",
    "D conv_dgrad",
    "E conv_dgrad + drelu + dbn_weight",
    "F conv_wgrad",
    "G scale-bias-relu + conv_wgrad",
    "H bn_finalize",
    "I conv_dgrad + drelu + the two batch-norm sums as reductions (runtime fusion)",
};

struct Summary {
    std::string pattern;
    double sum_ms = 0;
    int supported = 0, shapes = 0;
};

std::vector<Summary> summarise(const std::vector<Row>& rows) {
    std::vector<Summary> out;
    for (const char* name : kPatternNames) {
        Summary s;
        s.pattern = std::string(1, name[0]);
        for (auto& r : rows) {
            if (r.pattern != s.pattern) continue;
            ++s.shapes;
            if (r.supported && std::isfinite(r.median_ms)) {
                ++s.supported;
                s.sum_ms += r.median_ms;
            }
        }
        out.push_back(s);
    }
    return out;
}

// sum(fused) - sum(base) over the shapes where both ran.
struct Diff {
    std::string name;
    double fused_ms = 0, base_ms = 0;
    int shapes = 0;
};

Diff diff(const std::vector<Row>& rows, const std::string& fused, const std::string& base) {
    Diff d;
    d.name = fused + "-" + base;
    for (auto& r : rows) {
        if (r.pattern != fused || !r.supported || !std::isfinite(r.median_ms)) continue;
        for (auto& q : rows) {
            if (q.pattern == base && q.shape_index == r.shape_index && q.supported && std::isfinite(q.median_ms)) {
                d.fused_ms += r.median_ms;
                d.base_ms += q.median_ms;
                ++d.shapes;
            }
        }
    }
    return d;
}

double stats_pass_estimate_ms(const std::vector<Row>& rows) {
    // What a separate statistics pass over every forward output would cost at 3 TB/s (one read each).
    double bytes = 0;
    for (auto& r : rows)
        if (r.pattern == "A") bytes += r.out_bytes;
    return bytes / 3e12 * 1e3;
}

}  // namespace

std::string jnum(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

std::string frontend_version() {
    return std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
           std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

std::string cudnn_version_string(int64_t v) {
    // cuDNN 9 encodes its version as major*10000 + minor*100 + patch.
    return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

void print_table(const Meta& m, const std::vector<Row>& rows, const GenstatsCheck& gc, const Probe& p) {
    FILE* o = stderr;
    std::fprintf(o, "\ncuDNN fusion probe: %s (sm_%lld), cuDNN %s (built against %s), frontend %s\n", m.device.c_str(),
                 static_cast<long long>(m.sm), cudnn_version_string(m.cudnn_runtime).c_str(),
                 cudnn_version_string(m.cudnn_compiled).c_str(), frontend_version().c_str());
    std::fprintf(o, "bf16 NHWC, fp32 compute and statistics, N=256. Times: median of %d executions, one CUDA event "
                    "pair each, after %d warm-up.\n\n", p.iters, p.warmup);
    std::fprintf(o, "%-3s %-22s %-4s %9s %9s %7s %6s %5s %9s  %s\n", "pat", "shape", "ok", "median_ms", "heur_ms",
                 "TFLOP/s", "plans", "built", "build_ms", "engine / error");
    std::string last;
    for (auto& r : rows) {
        if (r.pattern != last) {
            for (const char* n : kPatternNames)
                if (r.pattern[0] == n[0]) std::fprintf(o, "-- %s\n", n);
            last = r.pattern;
        }
        char tf[32] = "";
        if (r.supported && r.flops > 0 && std::isfinite(r.median_ms))
            std::snprintf(tf, sizeof tf, "%.0f", r.flops / (r.median_ms * 1e-3) / 1e12);
        std::string tail;
        if (r.supported) {
            tail = r.engine + (r.runtime_compiled ? " [rtc]" : "") + (r.variant.empty() ? "" : " {" + r.variant + "}");
        } else {
            tail = r.tried ? "NO: " + first_line(r.error, 110) : first_line(r.error, 110);
        }
        std::fprintf(o, "%-3s %-22s %-4s %9s %9s %7s %6lld %5d %9s  %s\n", r.pattern.c_str(), r.shape.c_str(),
                     r.supported ? "yes" : "no", jnum(r.median_ms).c_str(), jnum(r.heuristic_ms).c_str(), tf,
                     static_cast<long long>(r.plans), r.plans_built, jnum(r.first_build_ms).c_str(), tail.c_str());
    }
    std::fprintf(o, "\nsummary (sum of medians over the shapes that ran):\n");
    for (auto& s : summarise(rows)) {
        std::fprintf(o, "  %s: %8.3f ms over %d of %d shapes\n", s.pattern.c_str(), s.sum_ms, s.supported, s.shapes);
    }
    for (auto pr : {std::make_pair("B", "A"), std::make_pair("C", "A"), std::make_pair("E", "D"),
                    std::make_pair("G", "F"), std::make_pair("I", "D")}) {
        Diff d = diff(rows, pr.first, pr.second);
        if (d.shapes)
            std::fprintf(o, "  %s: %+8.3f ms (%.3f vs %.3f) over %d shapes\n", d.name.c_str(), d.fused_ms - d.base_ms,
                         d.fused_ms, d.base_ms, d.shapes);
        else
            std::fprintf(o, "  %s: no shape ran both\n", d.name.c_str());
    }
    std::fprintf(o, "  a separate statistics pass over A's outputs at 3 TB/s would take about %.3f ms for these shapes\n",
                 stats_pass_estimate_ms(rows));
    if (gc.done || !gc.error.empty()) {
        if (!gc.error.empty())
            std::fprintf(o, "\ngenstats check (%s): failed: %s\n", gc.shape.c_str(), first_line(gc.error, 200).c_str());
        else
            std::fprintf(o,
                         "\ngenstats check (%s, %lld channels, outputs pre-filled with %s): max rel err sum %.3g, "
                         "max |err| / sum|y| %.3g, max rel err sum of squares %.3g\n",
                         gc.shape.c_str(), static_cast<long long>(gc.channels), gc.prefill.c_str(), gc.max_rel_err_sum,
                         gc.max_err_sum_over_l1, gc.max_rel_err_sqsum);
    }
    if (p.cuda_broken) std::fprintf(o, "\nCUDA context broke: %s\n", p.cuda_broken_msg.c_str());
    std::fprintf(o, "\nwall time %.1f s\n", m.wall_s);
}

std::string to_json(const Meta& m, const std::vector<Row>& rows, const GenstatsCheck& gc, const Probe& p) {
    std::ostringstream j;
    j << "{\n";
    j << "  \"probe\": \"cudnn_fusion_probe\",\n";
    j << "  \"cudnn_version\": " << jstr(cudnn_version_string(m.cudnn_runtime)) << ",\n";
    j << "  \"cudnn_version_int\": " << m.cudnn_runtime << ",\n";
    j << "  \"cudnn_compiled_version\": " << jstr(cudnn_version_string(m.cudnn_compiled)) << ",\n";
    j << "  \"frontend_version\": " << jstr(frontend_version()) << ",\n";
    j << "  \"cuda_runtime\": " << m.cuda_runtime << ",\n";
    j << "  \"cuda_driver\": " << m.cuda_driver << ",\n";
    j << "  \"device\": " << jstr_or_null(m.device) << ",\n";
    j << "  \"sm\": " << m.sm << ",\n";
    j << "  \"error\": " << jstr_or_null(m.error) << ",\n";
    j << "  \"config\": {\"dtype\": \"bf16\", \"layout\": \"NHWC\", \"compute\": \"fp32\", \"stats\": \"fp32\", "
         "\"batch\": 256, \"heuristics\": [\"A\", \"FALLBACK\"], \"warmup\": "
      << p.warmup << ", \"iters\": " << p.iters << ", \"max_plans\": " << p.max_plans
      << ", \"budget_s\": " << jnum(p.budget_s)
      << ", \"timing\": \"median of iters executions, one CUDA event pair per execution, after warmup executions; "
         "autotune candidates: 2 warm-up, median of 5\"},\n";
    j << "  \"rows\": [";
    bool first = true;
    for (auto& r : rows) {
        j << (first ? "\n" : ",\n");
        first = false;
        j << "    {\"shape\": " << jstr(r.shape) << ", \"pattern\": " << jstr(r.pattern)
          << ", \"supported\": " << jbool(r.supported) << ", \"tried\": " << jbool(r.tried)
          << ", \"error\": " << jstr_or_null(r.error.substr(0, 6000)) << ", \"median_ms\": " << jnum(r.median_ms)
          << ", \"min_ms\": " << jnum(r.min_ms) << ", \"max_ms\": " << jnum(r.max_ms)
          << ", \"heuristic_ms\": " << jnum(r.heuristic_ms) << ", \"plans\": " << r.plans
          << ", \"plans_built\": " << r.plans_built << ", \"plans_failed\": " << r.plans_failed
          << ", \"autotuned\": " << jbool(r.autotuned) << ", \"engine\": " << jstr_or_null(r.engine)
          << ", \"heuristic_engine\": " << jstr_or_null(r.heuristic_engine)
          << ", \"runtime_compiled\": " << jbool(r.runtime_compiled) << ", \"workspace_bytes\": " << r.workspace
          << ", \"first_build_ms\": " << jnum(r.first_build_ms) << ", \"graph_setup_ms\": " << jnum(r.graph_setup_ms)
          << ", \"variant\": " << jstr_or_null(r.variant) << ", \"variants_failed\": [";
        for (size_t i = 0; i < r.variant_errors.size(); ++i)
            j << (i ? ", " : "") << jstr(r.variant_errors[i].substr(0, 3000));
        j << "], \"flops\": " << jnum(r.flops) << ", \"tflops\": "
          << jnum(r.supported && r.flops > 0 ? r.flops / (r.median_ms * 1e-3) / 1e12 : kNaN)
          << ", \"out_bytes\": " << jnum(r.out_bytes) << ", \"plan_times\": [";
        for (size_t i = 0; i < r.plan_times.size(); ++i) {
            auto& pt = r.plan_times[i];
            j << (i ? ", " : "") << "{\"index\": " << pt.index << ", \"engine\": " << jstr(pt.engine)
              << ", \"ms\": " << jnum(pt.ms) << "}";
        }
        j << "]}";
    }
    j << "\n  ],\n";
    j << "  \"summary\": {";
    first = true;
    for (auto& s : summarise(rows)) {
        j << (first ? "\n" : ",\n");
        first = false;
        j << "    " << jstr(s.pattern) << ": {\"sum_median_ms\": " << jnum(s.sum_ms)
          << ", \"shapes_supported\": " << s.supported << ", \"shapes\": " << s.shapes << "}";
    }
    j << "\n  },\n";
    j << "  \"differences\": {";
    first = true;
    for (auto pr : {std::make_pair("B", "A"), std::make_pair("C", "A"), std::make_pair("E", "D"),
                    std::make_pair("G", "F"), std::make_pair("I", "D")}) {
        Diff d = diff(rows, pr.first, pr.second);
        j << (first ? "\n" : ",\n");
        first = false;
        j << "    " << jstr(d.name) << ": {\"fused_ms\": " << jnum(d.fused_ms) << ", \"base_ms\": " << jnum(d.base_ms)
          << ", \"delta_ms\": " << jnum(d.shapes ? d.fused_ms - d.base_ms : kNaN) << ", \"shapes\": " << d.shapes
          << "}";
    }
    j << "\n  },\n";
    j << "  \"separate_stats_pass_estimate_ms\": " << jnum(stats_pass_estimate_ms(rows)) << ",\n";
    j << "  \"genstats_check\": {\"done\": " << jbool(gc.done) << ", \"shape\": " << jstr_or_null(gc.shape)
      << ", \"channels\": " << gc.channels << ", \"prefill\": " << jstr_or_null(gc.prefill)
      << ", \"max_rel_err_sum\": " << jnum(gc.max_rel_err_sum)
      << ", \"max_err_sum_over_l1\": " << jnum(gc.max_err_sum_over_l1)
      << ", \"max_rel_err_sqsum\": " << jnum(gc.max_rel_err_sqsum) << ", \"error\": " << jstr_or_null(gc.error)
      << "},\n";
    j << "  \"cuda_broken\": " << (p.cuda_broken ? jstr(p.cuda_broken_msg) : "null") << ",\n";
    j << "  \"wall_s\": " << jnum(m.wall_s) << "\n";
    j << "}\n";
    return j.str();
}

void write_json(const std::string& path, const std::string& doc) {
    if (path.empty()) {
        std::fwrite(doc.data(), 1, doc.size(), stdout);
        std::fflush(stdout);
        return;
    }
    // Written beside the target and renamed over it, so that a reader never sees half a document.
    const std::string tmp = path + ".partial";
    {
        std::ofstream f(tmp);
        f << doc;
        if (!f) {
            std::fprintf(stderr, "cudnn_fusion_probe: could not write %s\n", tmp.c_str());
            return;
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        std::fprintf(stderr, "cudnn_fusion_probe: could not rename %s to %s\n", tmp.c_str(), path.c_str());
}

}  // namespace fusion_probe
