// Shared declarations of the cuDNN fusion probe (see main.cpp for what it measures and why): error
// helpers, ResNet-50's convolution shapes, the device buffers, the Row that carries one (pattern, shape)
// pair through the probe, the Probe's timing state, and the functions each .cpp file provides.
#pragma once

#include <cudnn_frontend.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace fusion_probe {

// ---------------------------------------------------------------------------------------------------------
// Small helpers (common.cpp)
// ---------------------------------------------------------------------------------------------------------

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct CudaFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void cuda_check(cudaError_t err, const char* what);
#define CUDA_OK(call) ::fusion_probe::cuda_check((call), #call)

// A frontend step that failed: the stage's name and cuDNN's message.
struct StepFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void fe_check(fe::error_t status, const char* stage);

// Seconds since the first call (main makes it first thing).
double now_s();

uint16_t to_bf16(float f);
float from_bf16(uint16_t h);

std::string first_line(const std::string& s, size_t max_chars);

// ---------------------------------------------------------------------------------------------------------
// Shapes (their tables in common.cpp) and device buffers
// ---------------------------------------------------------------------------------------------------------

struct ConvShape {
    const char* name;
    int64_t n, c, k, h, w, r, s, pad;  // stride 1, dilation 1: output is h x w
};

extern const std::vector<ConvShape> kShapes;

// One bn_finalize per distinct channel count; the element count per channel is N*H*W where that count
// first appears (it does not change the cost of the finalize).
struct FinalizeShape {
    int64_t c, nhw;
};
extern const std::vector<FinalizeShape> kFinalizeShapes;

constexpr int kMaxChannels = 2048;
constexpr int kPerChannelF32 = 16;  // fp32 per-channel buffers
constexpr int kPerChannelBf16 = 2;  // bf16 per-channel buffers

// All graphs share these buffers; each is sized for the largest shape that uses it.
struct Buffers {
    void* act[3] = {nullptr, nullptr, nullptr};  // bf16 activations: X / pre-norm X, Y or dY, dX or drelu
    void* wt[2] = {nullptr, nullptr};            // bf16 filters: W, dW
    float* chf[kPerChannelF32] = {};             // fp32 per-channel tensors
    uint16_t* chb[kPerChannelBf16] = {};         // bf16 per-channel tensors
    void* workspace = nullptr;
    int64_t workspace_bytes = 0;
    size_t act_elems = 0, wt_elems = 0;

    void ensure_workspace(int64_t bytes) {
        if (bytes <= workspace_bytes) return;
        if (workspace) CUDA_OK(cudaFree(workspace));
        workspace = nullptr;
        workspace_bytes = 0;
        CUDA_OK(cudaMalloc(&workspace, static_cast<size_t>(bytes)));
        workspace_bytes = bytes;
    }

    void release() {
        for (auto& p : act) if (p) cudaFree(p), p = nullptr;
        for (auto& p : wt) if (p) cudaFree(p), p = nullptr;
        for (auto& p : chf) if (p) cudaFree(p), p = nullptr;
        for (auto& p : chb) if (p) cudaFree(p), p = nullptr;
        if (workspace) cudaFree(workspace), workspace = nullptr;
        workspace_bytes = 0;
    }
};

void fill_bf16(void* dev, size_t elems, float lo, float hi, uint32_t seed);
void fill_f32(float* dev, size_t elems, float lo, float hi, uint32_t seed);

// Per-channel buffer roles (fp32 unless noted).
enum Chan {
    kScale = 0,     // batch-norm gamma (or equivalent scale), around 1
    kBias = 1,      // beta (or equivalent bias), around 0
    kMean = 2,      // saved mean
    kInvVar = 3,    // saved inverse standard deviation
    kOut0 = 4,      // outputs: sum, sq_sum, dscale, ...
    kRunMean = 12,  // running mean (bn_finalize input)
    kRunVar = 13,   // running variance (bn_finalize input)
    kSum = 14,      // bn_finalize input sum
    kSqSum = 15,    // bn_finalize input sum of squares
};

// ---------------------------------------------------------------------------------------------------------
// Graphs (graphs.cpp): one builder per pattern; each may have variants that the probe tries in order when
// an earlier one is not supported.
// ---------------------------------------------------------------------------------------------------------

struct BuiltGraph {
    std::shared_ptr<Graph> graph;
    std::vector<std::pair<TensorPtr, void*>> bindings;  // tensor -> device pointer
    double flops = 0;                                   // of the convolution, if any
    double out_bytes = 0;                               // bytes of the convolution's output activation
    // Set for B: the genstats outputs and Y, for the correctness check.
    TensorPtr y, sum, sq_sum;
};

using Builder = std::function<bool(int variant, std::string& variant_name, BuiltGraph& out)>;

// A, B and C: the forward convolution, plain (A), with genstats on its output (B), and also with scale, bias
// and ReLU on its input (C).
Builder make_fprop_builder(const ConvShape& s, const Buffers& b, bool with_genstats, bool with_prologue);
// D and E: the backward-data convolution, plain (D) or followed by drelu and dbn_weight (E).
Builder make_dgrad_builder(const ConvShape& s, const Buffers& b, bool fused);
// I: dgrad, the ReLU's gradient against the stored activation, and the batch norm's backward sums
// (sum of dz, sum of dz * (x - mean)) as ADD reductions: E's sums in the form the runtime-compiled
// fusion engine takes in bf16.
Builder make_dgrad_sums_builder(const ConvShape& s, const Buffers& b);
// F and G: the backward-weight convolution, plain (F) or with scale, bias and ReLU on its input (G).
Builder make_wgrad_builder(const ConvShape& s, const Buffers& b, bool with_prologue);
// H: bn_finalize.
Builder make_finalize_builder(const FinalizeShape& f, const Buffers& b);

// ---------------------------------------------------------------------------------------------------------
// Rows: one (pattern, shape) pair, its graph and what was learned about it
// ---------------------------------------------------------------------------------------------------------

struct PlanTime {
    int64_t index;
    std::string engine;
    double ms;
};

struct Row {
    std::string pattern, shape;
    int shape_index = -1;
    Builder builder;
    // Results
    bool tried = false, supported = false, autotuned = false, runtime_compiled = false;
    std::string error, variant, engine, heuristic_engine;
    std::vector<std::string> variant_errors;
    double median_ms = kNaN, heuristic_ms = kNaN, min_ms = kNaN, max_ms = kNaN;
    double first_build_ms = kNaN, graph_setup_ms = kNaN;
    int64_t plans = 0, chosen = -1, workspace = 0;
    int plans_built = 0, plans_failed = 0;
    std::vector<PlanTime> plan_times;
    double flops = 0, out_bytes = 0;
    // Kept for the second pass
    BuiltGraph bg;
    std::unordered_map<int64_t, void*> pack;
    int64_t next_plan = 0;
};

// Plan building, execution and timing (timing.cpp).
struct Probe {
    cudnnHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    Buffers bufs;
    int warmup = 5, iters = 20;
    int max_plans = 8;
    double budget_s = 200.0;
    double per_graph_build_s = 20.0;  // per variant, first pass
    bool cuda_broken = false;
    std::string cuda_broken_msg;

    std::vector<double> time_plan(Graph& g, std::unordered_map<int64_t, void*>& pack, int64_t index, int warm,
                                  int reps);
    void check_context();
    std::string engine_name(Graph& g, int64_t index);
    bool is_runtime_compiled(Graph& g, int64_t index);
    void build_first_plan(Row& row, BuiltGraph& bg);
    void first_pass(Row& row);
    void autotune(Row& row, double deadline);
};

// The genstats check: sums of B's output, on the host in double, against cuDNN's.
struct GenstatsCheck {
    bool done = false;
    std::string shape, error, prefill;
    double max_rel_err_sum = kNaN, max_err_sum_over_l1 = kNaN, max_rel_err_sqsum = kNaN;
    int64_t channels = 0;
};

GenstatsCheck check_genstats(Probe& p, Row& row, const ConvShape& s);

// ---------------------------------------------------------------------------------------------------------
// Output (report.cpp)
// ---------------------------------------------------------------------------------------------------------

struct Meta {
    std::string device, error;
    int64_t cudnn_runtime = 0, cudnn_compiled = 0, sm = 0;
    int cuda_runtime = 0, cuda_driver = 0;
    double wall_s = 0;
};

std::string jnum(double v);  // a number for JSON and the table: "null" when not finite
std::string frontend_version();
std::string cudnn_version_string(int64_t v);
void print_table(const Meta& m, const std::vector<Row>& rows, const GenstatsCheck& gc, const Probe& p);
std::string to_json(const Meta& m, const std::vector<Row>& rows, const GenstatsCheck& gc, const Probe& p);
void write_json(const std::string& path, const std::string& doc);

}  // namespace fusion_probe
