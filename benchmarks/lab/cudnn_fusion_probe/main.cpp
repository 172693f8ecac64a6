// cuDNN fusion probe: which convolution + batch-norm fusions does cuDNN offer for ResNet-50, and what do
// they cost?
//
// ResNet-50 spends a real share of each training step outside its convolutions: every batch norm reads the
// convolution's output once to gather per-channel statistics, once more to normalise it (with the ReLU),
// and the backward pass repeats the pattern for the gradients. cuDNN can fold some of that work into the
// convolution itself: the forward convolution can emit the per-channel sum and sum of squares of its
// output as it writes it ("genstats"), the next convolution can apply the batch norm's scale, bias and
// ReLU to its input as it loads it, and the backward data convolution can apply the ReLU's gradient and
// gather the batch norm's weight gradients on the way out. Whether those fusions exist for a given data
// type, layout, shape and GPU is only known by asking cuDNN, and what they cost is only known by timing
// them. This program asks and times, before anyone rewrites the model around them.
//
// For each ResNet-50 convolution shape at batch 256 (bf16 tensors, channels-last, fp32 accumulation and
// fp32 statistics) it builds these graphs with the cuDNN frontend's graph API:
//   A  the plain forward convolution (the baseline for B and C);
//   B  the forward convolution with genstats on its output;
//   C  scale, bias and ReLU applied to the convolution's input, then the convolution, then genstats;
//   D  the plain backward-data convolution (the baseline for E);
//   E  the backward-data convolution, then the ReLU's gradient against the batch norm's output (rebuilt
//      from the pre-norm tensor and its statistics), then the batch norm's weight gradients;
//   F  the plain backward-weight convolution (the baseline for G);
//   G  the backward-weight convolution with scale, bias and ReLU applied to its input;
//   I  the backward-data convolution, the ReLU's gradient against the stored activation, and the batch
//      norm's two backward sums (of dz and of dz * (x - mean)) as ADD reductions: E's sums in the form
//      cuDNN's runtime-compiled fusion engine takes (B's second variant is the forward's counterpart;
//      on Hopper in bf16 the specialized engines behind B, C, E and G refuse, the runtime engine runs);
// and, once per channel count,
//   H  bn_finalize: turns the sums into the mean, inverse deviation, equivalent scale and bias, and the
//      updated running statistics.
// Each graph goes through validate, build_operation_graph, the heuristics (modes A and fallback),
// check_support and plan building. A step that fails is recorded with cuDNN's message and the probe moves
// on: learning what is unsupported is half the point.
//
// Timing. First pass: the first plan the heuristics order lets us build, timed with 5 warm-up executions
// and then 20 executions, each between its own pair of CUDA events; the row reports the median of the 20.
// Second pass, while the time budget lasts: up to --max-plans further plans of every supported graph are
// built and timed briefly (2 warm-up, median of 5); if one beats the first pass by more than 2 percent it
// is timed again the full way and reported instead. Build times are reported too, because some fused
// engines are compiled at run time and that cost lands on the first step of training.
//
// For B on the first shape the probe also checks genstats: the output is copied back, summed per channel
// on the host in double precision, and compared with cuDNN's sums.
//
// Output: a table on stderr, one JSON document on stdout (or to the path given as the first argument).
// The summary sums each pattern's medians over the shapes, so that for example sum(B) - sum(A) can be set
// against the separate statistics pass it would replace; the estimate printed next to it assumes that pass
// reads each convolution output once at 3 TB/s.
//
// Usage: cudnn_fusion_probe [OUT.json] [--max-plans N] [--budget-s S] [--only PATTERNS] [--shapes N] [--dry-run]
// (--dry-run builds every graph and runs the frontend's validate() only: no GPU needed.)
//
// Files: common.h and common.cpp (shared types and helpers), graphs.cpp (the graph builders), timing.cpp
// (plans, execution and timing, the genstats check), report.cpp (the table and the JSON), main.cpp (the
// options and the driver).

#include "common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace fusion_probe;

int main(int argc, char** argv) {
    now_s();  // start the clock
    std::string out_path, only = "ABCDEFGHI";
    int shape_limit = static_cast<int>(kShapes.size());
    bool dry_run = false;
    Probe p;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto need = [&](const char* flag) -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "cudnn_fusion_probe: %s needs a value\n", flag);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--max-plans") p.max_plans = std::max(1, std::atoi(need("--max-plans").c_str()));
        else if (a == "--budget-s") p.budget_s = std::atof(need("--budget-s").c_str());
        else if (a == "--only") only = need("--only");
        else if (a == "--dry-run") dry_run = true;
        else if (a == "--shapes") shape_limit = std::max(1, std::min(shape_limit, std::atoi(need("--shapes").c_str())));
        else if (a == "-h" || a == "--help") {
            std::fprintf(stderr, "usage: %s [OUT.json] [--max-plans N] [--budget-s S] [--only ABCDEFGHI] [--shapes N] [--dry-run]\n",
                         argv[0]);
            return 0;
        } else if (!a.empty() && a[0] == '-') {
            std::fprintf(stderr, "cudnn_fusion_probe: unknown option %s\n", a.c_str());
            return 2;
        } else {
            out_path = a;
        }
    }

    Meta meta;
    meta.cudnn_compiled = CUDNN_VERSION;
    std::vector<Row> rows;
    GenstatsCheck gc;
    int rc = 0;

    // The rows, pattern by pattern, so that a budget that runs out leaves whole patterns rather than whole
    // shapes.
    auto wanted = [&](char pat) { return only.find(pat) != std::string::npos; };
    for (char pat : std::string("ABCDEFGI")) {
        if (!wanted(pat)) continue;
        for (int i = 0; i < shape_limit; ++i) {
            const ConvShape& s = kShapes[i];
            Row r;
            r.error = "not reached";
            r.pattern = std::string(1, pat);
            r.shape = s.name;
            r.shape_index = i;
            switch (pat) {
                case 'A': r.builder = make_fprop_builder(s, p.bufs, false, false); break;
                case 'B': r.builder = make_fprop_builder(s, p.bufs, true, false); break;
                case 'C': r.builder = make_fprop_builder(s, p.bufs, true, true); break;
                case 'D': r.builder = make_dgrad_builder(s, p.bufs, false); break;
                case 'E': r.builder = make_dgrad_builder(s, p.bufs, true); break;
                case 'F': r.builder = make_wgrad_builder(s, p.bufs, false); break;
                case 'G': r.builder = make_wgrad_builder(s, p.bufs, true); break;
                case 'I': r.builder = make_dgrad_sums_builder(s, p.bufs); break;
            }
            rows.push_back(std::move(r));
        }
    }
    if (wanted('H')) {
        for (size_t i = 0; i < kFinalizeShapes.size(); ++i) {
            Row r;
            r.error = "not reached";
            r.pattern = "H";
            r.shape = "bn_finalize C=" + std::to_string(kFinalizeShapes[i].c);
            r.shape_index = 100 + static_cast<int>(i);
            r.builder = make_finalize_builder(kFinalizeShapes[i], p.bufs);
            rows.push_back(std::move(r));
        }
    }

    if (dry_run) {
        // Graph construction and the frontend's validate() only: no device, no cuDNN handle. Checks that every
        // graph is well formed (shapes, strides, data types) on a machine without a GPU.
        int bad = 0;
        for (auto& r : rows) {
            std::string report;
            for (int variant = 0;; ++variant) {
                BuiltGraph bg;
                std::string vname;
                try {
                    if (!r.builder(variant, vname, bg)) break;
                    fe_check(bg.graph->validate(), "validate");
                    report += (report.empty() ? "" : "; ") + (vname.empty() ? std::string("ok") : vname + ": ok");
                } catch (std::exception& e) {
                    ++bad;
                    report += (report.empty() ? "" : "; ") + (vname.empty() ? std::string() : vname + ": ") + e.what();
                }
            }
            std::fprintf(stderr, "  %s %-22s %s\n", r.pattern.c_str(), r.shape.c_str(), report.c_str());
        }
        std::fprintf(stderr, "dry run: %d graph variants failed validate()\n", bad);
        return bad ? 1 : 0;
    }

    try {
        meta.cudnn_runtime = static_cast<int64_t>(cudnnGetVersion());  // needs no device
        cudaRuntimeGetVersion(&meta.cuda_runtime);
        cudaDriverGetVersion(&meta.cuda_driver);
        int devices = 0;
        cudaError_t err = cudaGetDeviceCount(&devices);
        if (err != cudaSuccess || devices == 0) {
            meta.error = std::string("no CUDA device available (cudaGetDeviceCount: ") +
                         (err == cudaSuccess ? "0 devices" : std::string(cudaGetErrorName(err)) + ", " +
                                                                 cudaGetErrorString(err)) +
                         ")";
            std::fprintf(stderr, "cudnn_fusion_probe: %s\n", meta.error.c_str());
            meta.wall_s = now_s();
            write_json(out_path, to_json(meta, rows, gc, p));
            return 2;
        }
        CUDA_OK(cudaSetDevice(0));
        cudaDeviceProp prop{};
        CUDA_OK(cudaGetDeviceProperties(&prop, 0));
        meta.device = prop.name;
        meta.sm = prop.major * 10 + prop.minor;

        cudnnStatus_t cs = cudnnCreate(&p.handle);
        if (cs != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string("cudnnCreate: ") + cudnnGetErrorString(cs));
        CUDA_OK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
        cs = cudnnSetStream(p.handle, p.stream);
        if (cs != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string("cudnnSetStream: ") + cudnnGetErrorString(cs));

        // Buffers, sized for the largest shape.
        size_t act = 0, wt = 0;
        for (auto& s : kShapes) {
            act = std::max<size_t>(act, static_cast<size_t>(s.n * std::max(s.c, s.k) * s.h * s.w));
            wt = std::max<size_t>(wt, static_cast<size_t>(s.k * s.c * s.r * s.s));
        }
        p.bufs.act_elems = act;
        p.bufs.wt_elems = wt;
        for (auto& a : p.bufs.act) CUDA_OK(cudaMalloc(&a, act * 2));
        for (auto& w : p.bufs.wt) CUDA_OK(cudaMalloc(&w, wt * 2));
        for (auto& c : p.bufs.chf) CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&c), kMaxChannels * 4));
        for (auto& c : p.bufs.chb) CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&c), kMaxChannels * 2));
        fill_bf16(p.bufs.act[0], act, -1.f, 1.f, 1);
        fill_bf16(p.bufs.act[1], act, -1.f, 1.f, 2);
        fill_bf16(p.bufs.act[2], act, -1.f, 1.f, 3);
        fill_bf16(p.bufs.wt[0], wt, -0.125f, 0.125f, 4);
        fill_bf16(p.bufs.wt[1], wt, -0.125f, 0.125f, 5);
        fill_f32(p.bufs.chf[kScale], kMaxChannels, 0.5f, 1.5f, 6);
        fill_f32(p.bufs.chf[kBias], kMaxChannels, -0.5f, 0.5f, 7);
        fill_f32(p.bufs.chf[kMean], kMaxChannels, -0.1f, 0.1f, 8);
        fill_f32(p.bufs.chf[kInvVar], kMaxChannels, 0.5f, 2.0f, 9);
        fill_f32(p.bufs.chf[kRunMean], kMaxChannels, -0.1f, 0.1f, 10);
        fill_f32(p.bufs.chf[kRunVar], kMaxChannels, 0.5f, 2.0f, 11);
        {
            // bn_finalize inputs that describe a real distribution: sum = n*mean, sq_sum = n*(mean^2 + var).
            std::vector<float> sum(kMaxChannels), sq(kMaxChannels);
            std::mt19937 rng(12);
            std::uniform_real_distribution<float> mean(-0.5f, 0.5f), var(0.5f, 2.0f);
            const double n = 256.0 * 28 * 28;
            for (int c = 0; c < kMaxChannels; ++c) {
                double mu = mean(rng), v = var(rng);
                sum[c] = static_cast<float>(n * mu);
                sq[c] = static_cast<float>(n * (mu * mu + v));
            }
            CUDA_OK(cudaMemcpy(p.bufs.chf[kSum], sum.data(), kMaxChannels * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(p.bufs.chf[kSqSum], sq.data(), kMaxChannels * 4, cudaMemcpyHostToDevice));
            std::vector<uint16_t> sb(kMaxChannels), bb(kMaxChannels);
            std::uniform_real_distribution<float> sdist(0.5f, 1.5f), bdist(-0.5f, 0.5f);
            for (int c = 0; c < kMaxChannels; ++c) {
                sb[c] = to_bf16(sdist(rng));
                bb[c] = to_bf16(bdist(rng));
            }
            CUDA_OK(cudaMemcpy(p.bufs.chb[0], sb.data(), kMaxChannels * 2, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(p.bufs.chb[1], bb.data(), kMaxChannels * 2, cudaMemcpyHostToDevice));
        }
        CUDA_OK(cudaDeviceSynchronize());
        std::fprintf(stderr, "cudnn_fusion_probe: %s, cuDNN %s, frontend %s; buffers ready at %.1f s\n",
                     meta.device.c_str(), cudnn_version_string(meta.cudnn_runtime).c_str(), frontend_version().c_str(),
                     now_s());

        // First pass: what is supported, at the heuristics' first choice.
        for (auto& r : rows) {
            if (p.cuda_broken) {
                r.error = "not tried: " + p.cuda_broken_msg;
                continue;
            }
            if (now_s() > p.budget_s) {
                r.error = "not tried: time budget spent";
                continue;
            }
            double t0 = now_s();
            try {
                p.first_pass(r);
            } catch (std::exception& e) {
                r.supported = false;
                r.error = std::string("unexpected: ") + e.what();
                p.check_context();
            } catch (...) {
                r.supported = false;
                r.error = "unexpected non-standard exception";
                p.check_context();
            }
            std::fprintf(stderr, "  [%6.1f s] %s %-22s %s %s (%.1f s)\n", now_s(), r.pattern.c_str(), r.shape.c_str(),
                         r.supported ? "ok " : "NO ",
                         r.supported ? (jnum(r.median_ms) + " ms  " + r.engine).c_str()
                                     : first_line(r.error, 100).c_str(),
                         now_s() - t0);
            if (r.pattern == "B" && r.shape_index == 0 && r.supported && !gc.done && gc.error.empty()) {
                gc = check_genstats(p, r, kShapes[0]);
            }
            // Keep the JSON current, so that a run stopped from outside still leaves what it learned.
            if (!out_path.empty()) {
                meta.wall_s = now_s();
                write_json(out_path, to_json(meta, rows, gc, p));
            }
        }

        // Second pass: more plans per supported graph, while the budget lasts.
        std::fprintf(stderr, "cudnn_fusion_probe: first pass done at %.1f s; trying more plans until %.0f s\n", now_s(),
                     p.budget_s);
        for (auto& r : rows) {
            if (p.cuda_broken || now_s() > p.budget_s) break;
            try {
                p.autotune(r, p.budget_s);
            } catch (...) {
                p.check_context();
            }
        }
    } catch (std::exception& e) {
        meta.error = e.what();
        std::fprintf(stderr, "cudnn_fusion_probe: %s\n", e.what());
        rc = 1;
    } catch (...) {
        meta.error = "unexpected non-standard exception";
        std::fprintf(stderr, "cudnn_fusion_probe: %s\n", meta.error.c_str());
        rc = 1;
    }

    meta.wall_s = now_s();
    print_table(meta, rows, gc, p);
    write_json(out_path, to_json(meta, rows, gc, p));

    // Graphs first (their plans belong to the handle), then the handle, stream and buffers.
    for (auto& r : rows) {
        r.bg = BuiltGraph{};
        r.builder = nullptr;
    }
    if (p.handle) cudnnDestroy(p.handle);
    if (p.stream) cudaStreamDestroy(p.stream);
    p.bufs.release();
    return rc;
}
