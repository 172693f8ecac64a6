// Plan building, execution and timing for the cuDNN fusion probe: the first pass (heuristics' first
// buildable plan), the second pass (further plans while the budget lasts) and the genstats check.
#include "common.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

namespace fusion_probe {

namespace {

double median(std::vector<double> v) {
    if (v.empty()) return kNaN;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

// Timing: `iters` executions, each between its own pair of events, after `warm` warm-up executions.
std::vector<double> Probe::time_plan(Graph& g, std::unordered_map<int64_t, void*>& pack, int64_t index,
                                     int warm, int reps) {
    int64_t ws = 0;
    fe_check(g.get_workspace_size_plan_at_index(index, ws), "get_workspace_size");
    bufs.ensure_workspace(ws);
    for (int i = 0; i < warm; ++i) {
        fe_check(g.execute_plan_at_index(handle, pack, bufs.workspace, index), "execute (warm-up)");
    }
    std::vector<cudaEvent_t> ev(2 * reps, nullptr);
    std::vector<double> ms;
    try {
        for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
        for (int i = 0; i < reps; ++i) {
            CUDA_OK(cudaEventRecord(ev[2 * i], stream));
            fe_check(g.execute_plan_at_index(handle, pack, bufs.workspace, index), "execute");
            CUDA_OK(cudaEventRecord(ev[2 * i + 1], stream));
        }
        CUDA_OK(cudaStreamSynchronize(stream));
        for (int i = 0; i < reps; ++i) {
            float t = 0;
            CUDA_OK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
            ms.push_back(t);
        }
    } catch (...) {
        for (auto& e : ev) if (e) cudaEventDestroy(e);
        throw;
    }
    for (auto& e : ev) if (e) cudaEventDestroy(e);
    return ms;
}

// After anything goes wrong on the device, find out whether the context still works.
void Probe::check_context() {
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) return;
    cudaGetLastError();
    cudaError_t again = cudaDeviceSynchronize();
    if (again != cudaSuccess) {
        cuda_broken = true;
        cuda_broken_msg = std::string("CUDA context unusable after ") + cudaGetErrorName(err) + ": " +
                          cudaGetErrorString(again);
    }
}

std::string Probe::engine_name(Graph& g, int64_t index) {
    std::string name;
    if (g.get_plan_name_at_index(index, name).is_bad()) return "";
    return name;
}

bool Probe::is_runtime_compiled(Graph& g, int64_t index) {
    std::vector<fe::BehaviorNote_t> notes;
    if (g.get_behavior_notes_for_plan_at_index(index, notes).is_bad()) return false;
    return std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) != notes.end();
}

// Builds one variant's graph as far as a first working plan. Throws StepFailure with the stage's name.
void Probe::build_first_plan(Row& row, BuiltGraph& bg) {
    Graph& g = *bg.graph;
    double t0 = now_s();
    fe_check(g.validate(), "validate");
    fe_check(g.build_operation_graph(handle), "build_operation_graph");
    // Both heuristics modes at once; if that query fails as a whole, each mode alone (a failed query
    // leaves the graph's plan list untouched, so asking again is safe).
    auto heur = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (heur.is_bad()) {
        std::string both = heur.get_message();
        heur = g.create_execution_plans({fe::HeurMode_t::A});
        if (heur.is_bad()) heur = g.create_execution_plans({fe::HeurMode_t::FALLBACK});
        if (heur.is_bad()) throw StepFailure("create_execution_plans(A, FALLBACK): " + both);
    }
    row.plans = g.get_execution_plan_count();
    if (row.plans == 0) throw StepFailure("create_execution_plans: heuristics returned no engine configs");
    fe_check(g.check_support(), "check_support");
    row.graph_setup_ms = (now_s() - t0) * 1e3;

    std::string failures;
    double b0 = now_s();
    for (int64_t i = 0; i < row.plans; ++i) {
        double t1 = now_s();
        auto st = g.build_plan_at_index(i);
        if (st.is_good()) {
            row.chosen = i;
            row.first_build_ms = (now_s() - t1) * 1e3;
            row.plans_built = 1;
            row.next_plan = i + 1;
            return;
        }
        ++row.plans_failed;
        if (failures.size() < 4000) failures += "\n  plan " + std::to_string(i) + ": " + st.get_message();
        if (now_s() - b0 > per_graph_build_s || now_s() > budget_s + 20) {
            failures += "\n  (gave up after " + std::to_string(i + 1) + " plans: build time limit)";
            break;
        }
    }
    throw StepFailure("build_plan_at_index: no plan of " + std::to_string(row.plans) + " built" + failures);
}

// First pass for one row: try variants until one builds; time the heuristics' first buildable plan.
void Probe::first_pass(Row& row) {
    row.tried = true;
    row.error.clear();
    for (int variant = 0;; ++variant) {
        BuiltGraph bg;
        std::string vname;
        bool exists = false;
        try {
            exists = row.builder(variant, vname, bg);
        } catch (std::exception& e) {
            exists = true;
            row.variant_errors.push_back((vname.empty() ? "" : vname + ": ") + "graph construction: " + e.what());
            continue;
        }
        if (!exists) break;
        row.flops = bg.flops;
        row.out_bytes = bg.out_bytes;
        try {
            row.plans = 0;
            row.plans_failed = 0;
            build_first_plan(row, bg);
            row.variant = vname;
            row.bg = bg;
            break;
        } catch (std::exception& e) {
            row.variant_errors.push_back((vname.empty() ? "" : "[" + vname + "] ") + e.what());
            row.chosen = -1;
        }
    }
    if (row.chosen < 0) {
        std::string err;
        for (auto& e : row.variant_errors) err += (err.empty() ? "" : "\n") + e;
        row.error = err.empty() ? "no graph variant could be built" : err;
        row.variant_errors.clear();
        return;
    }
    // Timing of the chosen plan.
    try {
        Graph& g = *row.bg.graph;
        row.pack.clear();
        for (auto& [t, p] : row.bg.bindings) row.pack[t->get_uid()] = p;
        int64_t ws = 0;
        fe_check(g.get_workspace_size_plan_at_index(row.chosen, ws), "get_workspace_size");
        row.workspace = ws;
        row.engine = row.heuristic_engine = engine_name(g, row.chosen);
        row.runtime_compiled = is_runtime_compiled(g, row.chosen);
        auto ms = time_plan(g, row.pack, row.chosen, warmup, iters);
        row.median_ms = row.heuristic_ms = median(ms);
        row.min_ms = *std::min_element(ms.begin(), ms.end());
        row.max_ms = *std::max_element(ms.begin(), ms.end());
        row.plan_times.push_back({row.chosen, row.engine, row.median_ms});
        row.supported = true;
    } catch (std::exception& e) {
        row.error = std::string("built but did not run: ") + e.what();
        row.supported = false;
        check_context();
    }
}

// Second pass for one supported row: build and briefly time further plans; keep the fastest.
void Probe::autotune(Row& row, double deadline) {
    if (!row.supported || !row.bg.graph) return;
    Graph& g = *row.bg.graph;
    int64_t best = row.chosen;
    double best_ms = row.heuristic_ms;
    int timed = 0;
    for (int64_t i = row.next_plan; i < row.plans && row.plans_built < max_plans; ++i) {
        if (now_s() > deadline) return;  // not marked autotuned: the budget ran out
        auto st = g.build_plan_at_index(i);
        if (st.is_bad()) {
            ++row.plans_failed;
            continue;
        }
        ++row.plans_built;
        try {
            auto ms = time_plan(g, row.pack, i, 2, 5);
            double m = median(ms);
            row.plan_times.push_back({i, engine_name(g, i), m});
            ++timed;
            if (m < best_ms * 0.98) {
                best_ms = m;
                best = i;
            }
        } catch (std::exception& e) {
            row.plan_times.push_back({i, engine_name(g, i) + " (failed: " + first_line(e.what(), 80) + ")", kNaN});
            check_context();
            if (cuda_broken) return;
        }
    }
    row.autotuned = true;
    if (best != row.chosen) {
        try {
            auto ms = time_plan(g, row.pack, best, warmup, iters);
            double m = median(ms);
            if (m < row.heuristic_ms) {
                row.median_ms = m;
                row.min_ms = *std::min_element(ms.begin(), ms.end());
                row.max_ms = *std::max_element(ms.begin(), ms.end());
                row.chosen = best;
                row.engine = engine_name(g, best);
                row.runtime_compiled = is_runtime_compiled(g, best);
                int64_t ws = 0;
                if (g.get_workspace_size_plan_at_index(best, ws).is_good()) row.workspace = ws;
            }
        } catch (std::exception&) {
            check_context();
        }
    }
}

// The genstats check: sums of B's output, on the host in double, against cuDNN's.
GenstatsCheck check_genstats(Probe& p, Row& row, const ConvShape& s) {
    GenstatsCheck c;
    c.shape = row.shape;
    c.channels = s.k;
    try {
        Graph& g = *row.bg.graph;
        void* sum_dev = row.pack.at(row.bg.sum->get_uid());
        void* sq_dev = row.pack.at(row.bg.sq_sum->get_uid());
        void* y_dev = row.pack.at(row.bg.y->get_uid());
        const size_t k = static_cast<size_t>(s.k);
        const size_t elems = static_cast<size_t>(s.n * s.k * s.h * s.w);
        std::vector<uint16_t> y(elems);
        std::vector<float> sum(k), sq(k);
        // Pre-fill the outputs with NaN (all bits set): a graph that adds into them rather than writing them
        // would show it. If that happens, repeat with zeros to see whether accumulation is all that differs.
        for (int attempt = 0; attempt < 2; ++attempt) {
            int fill = attempt == 0 ? 0xff : 0x00;
            c.prefill = attempt == 0 ? "NaN" : "zero";
            CUDA_OK(cudaMemsetAsync(sum_dev, fill, k * 4, p.stream));
            CUDA_OK(cudaMemsetAsync(sq_dev, fill, k * 4, p.stream));
            fe_check(g.execute_plan_at_index(p.handle, row.pack, p.bufs.workspace, row.chosen), "execute");
            CUDA_OK(cudaStreamSynchronize(p.stream));
            CUDA_OK(cudaMemcpy(y.data(), y_dev, elems * 2, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(sum.data(), sum_dev, k * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(sq.data(), sq_dev, k * 4, cudaMemcpyDeviceToHost));
            std::vector<double> rs(k, 0.0), rq(k, 0.0), l1(k, 0.0);
            for (size_t i = 0; i < elems; ++i) {
                size_t ch = i % k;  // channels-last: the channel is the fastest dimension
                double v = from_bf16(y[i]);
                rs[ch] += v;
                rq[ch] += v * v;
                l1[ch] += std::fabs(v);
            }
            double e_sum = 0, e_l1 = 0, e_sq = 0;
            bool finite = true;
            for (size_t ch = 0; ch < k; ++ch) {
                if (!std::isfinite(sum[ch]) || !std::isfinite(sq[ch])) finite = false;
                double ds = std::fabs(sum[ch] - rs[ch]);
                e_sum = std::max(e_sum, ds / std::max(std::fabs(rs[ch]), 1e-30));
                e_l1 = std::max(e_l1, ds / std::max(l1[ch], 1e-30));
                e_sq = std::max(e_sq, std::fabs(sq[ch] - rq[ch]) / std::max(rq[ch], 1e-30));
            }
            c.max_rel_err_sum = finite ? e_sum : kNaN;
            c.max_err_sum_over_l1 = finite ? e_l1 : kNaN;
            c.max_rel_err_sqsum = finite ? e_sq : kNaN;
            c.done = true;
            if (finite && e_sq < 1e-2) break;
        }
    } catch (std::exception& e) {
        c.error = e.what();
        p.check_context();
    }
    return c;
}
}  // namespace fusion_probe
