// A convolution's passes as cuDNN graphs with plans timed once a shape and kept (see
// cudnn_conv_plans.h). Why not LibTorch's convolution with cudnn.benchmark: ATen times the same
// candidates, but keeps what it picked per thread (its plan cache is thread_local and not
// exported), so every thread that runs a shape times it again and every process starts from
// nothing. Here one table serves every thread, and a pick is an (engine, knobs) pair cuDNN can
// rebuild a plan from in a later process without timing anything. Like cudnn_conv_graphs.cpp
// (whose loaded libcudnn this uses), compiled with hidden visibility beside LibTorch's own
// frontend.
#include "cudnn_conv_plans.h"

#if defined(TANDEM_HAVE_CUDNN_FRONTEND)

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cudnn_frontend.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cudnn_conv_graphs.h"
#include "kernel_warmup.h"
#include "posix_fs.h"

namespace tandem::models::detail {
namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kA = 1, kB, kOut };

// The plans file's layout; a file of another layout is ignored.
constexpr int kFileFormat = 1;
// Candidates timed a shape where torch.backends.cudnn.benchmark_limit is 0 ("all"): cuDNN's
// ranked list runs to dozens, and its tail is rarely the fastest.
constexpr int64_t kAllCandidates = 64;
// A candidate asking for more scratch than this is not timed (ATen tries to allocate and skips
// what does not fit; a bound keeps the tuning from evicting the caching allocator's blocks).
constexpr int64_t kMaxWorkspaceBytes = int64_t{1} << 30;
constexpr int kTimedRuns = 3;
// A candidate whose first timed run takes more than this many times the fastest's mean, and
// this much longer besides, is not run again: it cannot win, and at a large batch a slow
// candidate's runs take milliseconds each (MobileNetV3-Large's depthwise passes at bs 256 spent
// ~11 s of a first fit timing). The slack: a lone run's time holds its launch, which the mean
// of back-to-back runs hides, so a few-microsecond kernel is never dropped on one run.
constexpr double kBehindTheFastest = 2.0;
constexpr double kLoneRunSlackUs = 50.0;
// A runtime-compiled plan's serialized form (its compiled code in it) is kept where it is at
// most this long; a longer one is compiled again by a later process.
constexpr size_t kMaxSerializedPlanBytes = size_t{8} << 20;

// What decides a pass's plan, without its data: the pass, dtype, every operand's sizes and
// strides, the geometry. Kept with a choice so a later process can build its plan before any
// tensor of the shape exists (prebuild_plans).
struct Operands {
  ConvPass pass = ConvPass::kForward;
  at::ScalarType dtype = at::kHalf;
  std::vector<int64_t> a_sizes, a_strides, b_sizes, b_strides, out_sizes, out_strides;
  std::vector<int64_t> stride, padding, dilation;
};

struct Choice {
  int64_t engine = 0;
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (KnobType_t, value)
  double microseconds = 0.0;                       // as timed when it was picked
  // A plan whose engine compiles its kernel at run time (NVRTC: 0.3-1 s a plan), as the
  // frontend serializes it (Graph::serialize, without the graph's structure): its compiled code
  // with it, so a later process deserializes it instead of compiling again. Null for the
  // precompiled engines' plans: those rebuild from the lists as fast as they deserialize
  // (3-10 ms a plan either way, measured), and the cold process would pay the serialization.
  nlohmann::json serialized;
  std::optional<Operands> operands;  // absent in a file an older build wrote
  std::set<std::string> jobs;        // the jobs (set_plans_job) whose convolutions used it
};

// One shape's graph with the plan it runs (index into the graph's plans).
struct PassPlan {
  std::shared_ptr<fe::graph::Graph> graph;  // null where cuDNN has no plan for the shape
  int64_t index = -1;
  int64_t workspace = 0;
  std::string why_not;
  std::string job_noted;  // the job last noted in its choice (the table's job, once per change)
};

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<PassPlan>> plans;  // by device and shape
  std::map<std::string, Choice> choices;  // timed here or loaded: what a save writes
  ConvPlansSummary counts;
  std::string job;       // set_plans_job's: noted in the choices the next calls use
  bool unsaved = false;  // choices or notes the file does not have yet
};

Table& table() {
  static auto* t = new Table;  // never destroyed: threads may convolve during exit
  return *t;
}

std::vector<int64_t> vec(at::IntArrayRef a) { return {a.begin(), a.end()}; }

fe::DataType_t data_type(at::ScalarType t) {
  return t == at::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::string device_key(int device) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device);
  return std::string(p->name) + " sm" + std::to_string(p->major * 10 + p->minor);
}

Operands operands_of(ConvPass pass, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                     const ConvGeometry& g) {
  return {pass,           a.scalar_type(),  vec(a.sizes()),   vec(a.strides()),
          vec(b.sizes()), vec(b.strides()), vec(out.sizes()), vec(out.strides()),
          vec(g.stride),  vec(g.padding),   vec(g.dilation)};
}

// A pass's key in the table and the file (after its device's), from what decides its plan:
// a's, b's and out's sizes and strides, then the stride, padding and dilation, in that order.
std::string shape_key(ConvPass pass, at::ScalarType dtype,
                      const std::array<at::IntArrayRef, 9>& d) {
  static const char* const kPass[] = {"fprop", "dgrad", "wgrad"};
  std::ostringstream k;
  k << kPass[static_cast<int>(pass)] << ' ' << dtype << ' ' << d[0] << d[1] << ' ' << d[2] << d[3]
    << ' ' << d[4] << d[5] << " s" << d[6] << " p" << d[7] << " d" << d[8];
  return k.str();
}

// On every call: from the tensors as they are, no copy.
std::string shape_key(ConvPass pass, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& out, const ConvGeometry& g) {
  return shape_key(pass, a.scalar_type(),
                   {a.sizes(), a.strides(), b.sizes(), b.strides(), out.sizes(), out.strides(),
                    g.stride, g.padding, g.dilation});
}

std::string shape_key(const Operands& o) {
  return shape_key(o.pass, o.dtype,
                   {o.a_sizes, o.a_strides, o.b_sizes, o.b_strides, o.out_sizes, o.out_strides,
                    o.stride, o.padding, o.dilation});
}

nlohmann::json to_json(const Operands& o) {
  return {{"pass", static_cast<int>(o.pass)},
          {"dtype", o.dtype == at::kBFloat16 ? "bfloat16" : "half"},
          {"a", {o.a_sizes, o.a_strides}},
          {"b", {o.b_sizes, o.b_strides}},
          {"out", {o.out_sizes, o.out_strides}},
          {"stride", o.stride},
          {"padding", o.padding},
          {"dilation", o.dilation}};
}

// The operands a file kept for `key`, or none where they are not there or do not make the key
// (nlohmann's exceptions where malformed: the caller's catch).
std::optional<Operands> operands_from(const nlohmann::json& j, const std::string& key) {
  Operands o;
  const int pass = j.at("pass").get<int>();
  if (pass < 0 || pass > 2) return std::nullopt;
  o.pass = static_cast<ConvPass>(pass);
  o.dtype = j.at("dtype").get<std::string>() == "bfloat16" ? at::kBFloat16 : at::kHalf;
  j.at("a").at(0).get_to(o.a_sizes);
  j.at("a").at(1).get_to(o.a_strides);
  j.at("b").at(0).get_to(o.b_sizes);
  j.at("b").at(1).get_to(o.b_strides);
  j.at("out").at(0).get_to(o.out_sizes);
  j.at("out").at(1).get_to(o.out_strides);
  j.at("stride").get_to(o.stride);
  j.at("padding").get_to(o.padding);
  j.at("dilation").get_to(o.dilation);
  const size_t bar = key.find(" | ");
  if (bar == std::string::npos || key.compare(bar + 3, std::string::npos, shape_key(o)) != 0)
    return std::nullopt;
  return o;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const std::vector<int64_t>& sizes,
                                                    const std::vector<int64_t>& strides,
                                                    at::ScalarType dtype) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(sizes)
                      .set_stride(strides)
                      .set_data_type(data_type(dtype)));
}

// The pass's operation graph, built as far as its engines' list.
std::shared_ptr<fe::graph::Graph> operation_graph(const Operands& o, cudnnHandle_t handle,
                                                  std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(data_type(o.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // The three passes' attributes differ in type only.
  auto geometry = [&](auto attributes, const char* name) {
    attributes.set_name(name).set_padding(o.padding).set_stride(o.stride).set_dilation(o.dilation);
    return attributes;
  };
  std::shared_ptr<fe::graph::Tensor_attributes> result;
  const auto a = [&](const char* name) {
    return input(*g, name, kA, o.a_sizes, o.a_strides, o.dtype);
  };
  const auto b = [&](const char* name) {
    return input(*g, name, kB, o.b_sizes, o.b_strides, o.dtype);
  };
  switch (o.pass) {
    case ConvPass::kForward:
      result = g->conv_fprop(a("x"), b("w"), geometry(fe::graph::Conv_fprop_attributes(), "fprop"));
      break;
    case ConvPass::kInputGrad:
      result =
          g->conv_dgrad(a("dy"), b("w"), geometry(fe::graph::Conv_dgrad_attributes(), "dgrad"));
      break;
    case ConvPass::kWeightGrad:
      result =
          g->conv_wgrad(a("dy"), b("x"), geometry(fe::graph::Conv_wgrad_attributes(), "wgrad"));
      break;
  }
  result->set_output(true)
      .set_uid(kOut)
      .set_dim(o.out_sizes)
      .set_stride(o.out_strides)
      .set_data_type(data_type(o.dtype));
  fe::error_t e = g->validate();
  if (e.is_good()) e = g->build_operation_graph(handle);
  if (e.is_bad()) {
    why = e.get_message();
    return nullptr;
  }
  return g;
}

// The engine and knobs of cuDNN's candidate `i`, as kept (knobs sorted by type).
bool choice_at(fe::graph::Graph& g, int64_t i, Choice& c) {
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
  if (g.get_engine_and_knobs_at_index(i, c.engine, knobs).is_bad()) return false;
  c.knobs.clear();
  for (const auto& [type, value] : knobs) c.knobs.emplace_back(static_cast<int64_t>(type), value);
  std::sort(c.knobs.begin(), c.knobs.end());
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// f(), its seconds added to `into`: where a plan's seconds went (the summary's parts).
template <typename F>
auto timed(double& into, F&& f) {
  const auto started = std::chrono::steady_clock::now();
  auto result = f();
  into += seconds_since(started);
  return result;
}

// The kept plan deserialized into a graph of its own (index 0), or null where it has no
// serialized form or this cuDNN does not take it back (the lists are asked then).
std::shared_ptr<fe::graph::Graph> deserialized(const Choice& kept, cudnnHandle_t handle,
                                               int64_t& workspace, ConvPlansSummary& counts) {
  if (!kept.serialized.is_object()) return nullptr;
  auto g = std::make_shared<fe::graph::Graph>();
  const bool ok = timed(counts.building_seconds, [&] {
    try {  // no warm-up run: the caller runs it
      return g->deserialize(handle, kept.serialized, false, /*run_warmup=*/false).is_good() &&
             g->get_execution_plan_count() == 1 &&
             g->get_workspace_size_plan_at_index(0, workspace).is_good();
    } catch (const std::exception&) {  // a malformed entry: json's exceptions
      return false;
    }
  });
  if (!ok) return nullptr;
  ++counts.from_compiled;
  return g;
}

// Whether the plan at `index` is of an engine that compiles its kernel at run time.
bool runtime_compiled(const fe::graph::Graph& g, int64_t index) {
  std::vector<fe::BehaviorNote_t> notes;
  return g.get_behavior_notes_for_plan_at_index(index, notes).is_good() &&
         std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) !=
             notes.end();
}

// The plan at `index` serialized (its graph's candidate made that one: the frontend serializes
// its candidate), or null where the frontend gives none or it is too long to keep.
nlohmann::json serialized_plan(fe::graph::Graph& g, int64_t index) {
  try {
    std::vector<uint8_t> data;
    if (g.build_plan_at_index(index).is_bad() || g.serialize(data, false).is_bad() ||
        data.size() > kMaxSerializedPlanBytes)
      return nullptr;
    return nlohmann::json::from_ubjson(data);
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The kept engine configured with its knobs directly (create_execution_plan: no heuristics
// query, no candidate list) and its plan built: its index, or -1 where the frontend does not
// take the knobs back (some knob types cuDNN reports do not convert), configures another
// engine than the kept one or does not build it; the lists are asked then.
int64_t configured(fe::graph::Graph& g, const Choice& kept, ConvPlansSummary& counts) {
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
  for (const auto& [type, value] : kept.knobs) knobs[static_cast<fe::KnobType_t>(type)] = value;
  const int64_t before = g.get_execution_plan_count();
  fe::error_t e =
      timed(counts.listing_seconds, [&] { return g.create_execution_plan(kept.engine, knobs); });
  const int64_t i = g.get_execution_plan_count() - 1;
  Choice c;
  if (e.is_bad() || i < before || !choice_at(g, i, c) || c.engine != kept.engine ||
      c.knobs != kept.knobs)
    return -1;
  const bool built =
      timed(counts.building_seconds, [&] { return g.build_plan_at_index(i); }).is_good();
  return built ? i : -1;
}

// A kept choice found again: configured directly, else among cuDNN's candidates (listing them
// costs no plan build), and its plan built: its index, or -1 (and why) where this cuDNN no
// longer lists or builds it. The heuristics' own list first, where most picks come from, and
// the fallback list (every engine, the longer query) only where the choice is not in it: the
// tuning listed both.
int64_t rebuild(fe::graph::Graph& g, const Choice& kept, std::string& why, ConvPlansSummary& counts,
                bool& direct) {
  direct = false;
  if (const int64_t i = configured(g, kept, counts); i >= 0) {
    direct = true;
    return i;
  }
  Choice c;
  for (const fe::HeurMode_t mode : {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}) {
    const int64_t listed_before = g.get_execution_plan_count();  // a list appends to the last
    fe::error_t e = timed(counts.listing_seconds, [&] { return g.create_execution_plans({mode}); });
    if (e.is_bad()) {  // the other list may still hold it
      why = e.get_message();
      continue;
    }
    why.clear();
    for (int64_t i = listed_before; i < g.get_execution_plan_count(); ++i) {
      if (!choice_at(g, i, c) || c.engine != kept.engine || c.knobs != kept.knobs) continue;
      fe::error_t built = timed(counts.building_seconds, [&] { return g.build_plan_at_index(i); });
      if (built.is_good()) return i;
      why = built.get_message();
      return -1;
    }
  }
  if (why.empty()) why = "cuDNN no longer lists it for the shape";
  return -1;
}

// Times the candidates built in `g` on the pass's own tensors and returns the fastest's index
// (-1 where none ran). The stream is synchronized once a candidate; the last candidate's output
// is overwritten by the caller's run of the pick.
int64_t fastest(fe::graph::Graph& g, const std::vector<int64_t>& candidates,
                std::unordered_map<int64_t, void*>& pack, cudnnHandle_t handle,
                const at::Tensor& like, double& best_us) {
  std::vector<std::pair<int64_t, int64_t>> sized;  // (workspace, index)
  for (int64_t i : candidates) {
    int64_t bytes = 0;
    if (g.get_workspace_size_plan_at_index(i, bytes).is_good() && bytes <= kMaxWorkspaceBytes)
      sized.emplace_back(bytes, i);
  }
  std::sort(sized.begin(), sized.end());
  at::Tensor workspace;
  while (!sized.empty()) {  // the most any candidate asks for, else drop the greediest
    try {
      workspace =
          at::empty({std::max<int64_t>(sized.back().first, 1)}, like.options().dtype(at::kByte));
      break;
    } catch (const c10::OutOfMemoryError&) {
      sized.pop_back();
    }
  }
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(like.get_device());
  int64_t best = -1;
  best_us = 0.0;
  for (const auto& [bytes, i] : sized) {
    if (g.execute_plan_at_index(handle, pack, workspace.mutable_data_ptr(), i).is_bad()) continue;
    at::cuda::CUDAEvent start(cudaEventDefault), first(cudaEventDefault), stop(cudaEventDefault);
    start.record(stream);
    bool ran = g.execute_plan_at_index(handle, pack, workspace.mutable_data_ptr(), i).is_good();
    if (ran && best >= 0) {
      first.record(stream);
      first.synchronize();
      const double first_us = 1000.0 * start.elapsed_time(first);
      if (first_us > kBehindTheFastest * best_us + kLoneRunSlackUs) continue;
    }
    for (int r = 1; r < kTimedRuns && ran; ++r)
      ran = g.execute_plan_at_index(handle, pack, workspace.mutable_data_ptr(), i).is_good();
    stop.record(stream);
    stop.synchronize();
    if (!ran) continue;
    const double us = 1000.0 * start.elapsed_time(stop) / kTimedRuns;
    if (best < 0 || us < best_us) best = i, best_us = us;
  }
  return best;
}

// The operation graph, its seconds counted as a part of the listing's.
std::shared_ptr<fe::graph::Graph> timed_graph(const Operands& o, cudnnHandle_t handle,
                                              std::string& why, ConvPlansSummary& counts) {
  const double before = counts.graph_seconds;
  auto g = timed(counts.graph_seconds, [&] { return operation_graph(o, handle, why); });
  counts.listing_seconds += counts.graph_seconds - before;
  return g;
}

// A kept choice's plan built again: deserialized with its compiled code, configured from its
// engine and knobs, or found in cuDNN's lists; null (and why) where it does not come back. Its
// parts' seconds and kinds counted into `counts` (from_file and the seconds of the whole are
// the caller's).
std::shared_ptr<PassPlan> kept_plan(const Operands& o, const Choice& kept, cudnnHandle_t handle,
                                    ConvPlansSummary& counts, std::string& why) {
  auto plan = std::make_shared<PassPlan>();
  if ((plan->graph = deserialized(kept, handle, plan->workspace, counts))) {
    plan->index = 0;
    return plan;
  }
  if (!(plan->graph = timed_graph(o, handle, why, counts))) return nullptr;
  fe::graph::Graph& g = *plan->graph;
  bool direct = false;
  const int64_t i = rebuild(g, kept, why, counts, direct);
  if (i < 0) return nullptr;
  if (g.get_workspace_size_plan_at_index(i, plan->workspace).is_bad()) {
    why = "its workspace size was not given";
    return nullptr;
  }
  plan->index = i;
  counts.configured += direct;
  counts.runtime_compiled += runtime_compiled(g, i);  // compiled again
  return plan;
}

// Operands (with workspace) at most this large are run once where their plan is built ahead:
// the run loads the plan's kernels (CUDA loads a kernel lazily, on its first launch: ~3 ms a
// convolution, ~0.1 s of a small ResNet's first step) off the step's path. Larger ones are left
// to load on their first call, where a step long enough to need them hides it, and where eight
// threads' scratch would take gigabytes.
constexpr int64_t kMaxRunOnceBytes = int64_t{256} << 20;

// Runs a plan built ahead once on scratch operands of its shape (their values unused), on the
// current stream, to load its kernels; skipped where they are larger than kMaxRunOnceBytes or
// do not fit in memory.
void run_once(const PassPlan& plan, const Operands& o, cudnnHandle_t handle, int device) {
  const auto options = at::TensorOptions().device(at::kCUDA, device).dtype(o.dtype);
  const auto bytes = [&](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    int64_t last = 0;
    for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * strides[d];
    return (last + 1) * static_cast<int64_t>(c10::elementSize(o.dtype));
  };
  if (bytes(o.a_sizes, o.a_strides) + bytes(o.b_sizes, o.b_strides) +
          bytes(o.out_sizes, o.out_strides) + plan.workspace >
      kMaxRunOnceBytes)
    return;
  try {
    at::Tensor a = at::empty_strided(o.a_sizes, o.a_strides, options);
    at::Tensor b = at::empty_strided(o.b_sizes, o.b_strides, options);
    at::Tensor out = at::empty_strided(o.out_sizes, o.out_strides, options);
    at::Tensor workspace =
        at::empty({std::max<int64_t>(plan.workspace, 1)}, options.dtype(at::kByte));
    std::unordered_map<int64_t, void*> pack = {
        {kA, a.mutable_data_ptr()}, {kB, b.mutable_data_ptr()}, {kOut, out.mutable_data_ptr()}};
    // A run that fails here fails again at the shape's first call, which says why.
    (void)plan.graph->execute_plan_at_index(handle, pack, workspace.mutable_data_ptr(), plan.index);
  } catch (const c10::OutOfMemoryError&) {  // its kernels load on its first call instead
  }
}

// The shape's plan: rebuilt from a kept choice, or timed among cuDNN's candidates (while
// capturing, cuDNN's first choice untimed: nothing may synchronize then).
std::shared_ptr<PassPlan> plan_for(ConvPass pass, const at::Tensor& a, const at::Tensor& b,
                                   at::Tensor& out, const ConvGeometry& geo, const std::string& key,
                                   cudnnHandle_t handle, Table& t) {
  const auto started = std::chrono::steady_clock::now();
  const Operands o = operands_of(pass, a, b, out, geo);
  if (const auto kept = t.choices.find(key); kept != t.choices.end()) {
    std::string why;
    if (auto plan = kept_plan(o, kept->second, handle, t.counts, why)) {
      ++t.counts.from_file;
      t.counts.rebuilding_seconds += seconds_since(started);
      if (!kept->second.operands) {  // a file an older build wrote: keep them from now on
        kept->second.operands = o;
        t.unsaved = true;
      }
      return plan;
    }
    std::fprintf(stderr,
                 "tandem: a kept cuDNN plan for the convolution %s was not rebuilt (%s): timing "
                 "the candidates again\n",
                 key.c_str(), why.c_str());
    t.choices.erase(kept);
  }
  auto plan = std::make_shared<PassPlan>();
  plan->graph = timed_graph(o, handle, plan->why_not, t.counts);
  if (!plan->graph) return plan;
  fe::graph::Graph& fresh = *plan->graph;
  fe::error_t e = timed(t.counts.listing_seconds, [&] {
    fe::error_t listed =
        fresh.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    // As ATen's candidates: none that converts its inputs to a narrower type.
    if (listed.is_good()) fresh.deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
    return listed.is_good() ? fresh.check_support() : listed;
  });
  if (e.is_bad()) {
    plan->why_not = e.get_message();
    plan->graph.reset();
    return plan;
  }
  const bool capturing =
      c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  const int limit = at::globalContext().benchmarkLimitCuDNN();
  const int64_t wanted = capturing ? 1 : (limit > 0 ? limit : kAllCandidates);
  std::vector<int64_t> built;
  for (int64_t i = 0;
       i < fresh.get_execution_plan_count() && static_cast<int64_t>(built.size()) < wanted; ++i)
    if (timed(t.counts.building_seconds, [&] { return fresh.build_plan_at_index(i).is_good(); }))
      built.push_back(i);
  if (built.empty()) {
    plan->why_not = "no candidate plan built";
    plan->graph.reset();
    return plan;
  }
  if (capturing) {  // untimed, not kept: a later process times it
    plan->index = built.front();
    ++t.counts.untimed;
    t.counts.runtime_compiled += runtime_compiled(fresh, plan->index);
  } else {
    std::unordered_map<int64_t, void*> pack = {{kA, const_cast<void*>(a.const_data_ptr())},
                                               {kB, const_cast<void*>(b.const_data_ptr())},
                                               {kOut, out.mutable_data_ptr()}};
    double us = 0.0;
    plan->index = fastest(fresh, built, pack, handle, a, us);
    if (plan->index < 0) {
      plan->why_not = "no candidate plan ran";
      plan->graph.reset();
      return plan;
    }
    const bool compiled = runtime_compiled(fresh, plan->index);
    t.counts.runtime_compiled += compiled;
    if (Choice c; choice_at(fresh, plan->index, c)) {
      c.microseconds = us;
      if (compiled) c.serialized = serialized_plan(fresh, plan->index);
      c.operands = o;
      t.choices[key] = std::move(c);
      t.unsaved = true;
    }
    ++t.counts.tuned;
    t.counts.tuning_seconds += seconds_since(started);
  }
  if (fresh.get_workspace_size_plan_at_index(plan->index, plan->workspace).is_bad()) {
    plan->why_not = "the picked plan's workspace size was not given";
    plan->graph.reset();
  }
  return plan;
}

// The table's job noted in `key`'s choice (where it has one), once per change of job: which
// plans a job uses, for a later process to build ahead. Under the table's lock.
void note_job(Table& t, const std::string& key, PassPlan& plan) {
  plan.job_noted = t.job;
  if (t.job.empty()) return;
  const auto c = t.choices.find(key);
  if (c != t.choices.end() && c->second.jobs.insert(t.job).second) t.unsaved = true;
}

}  // namespace

bool cudnn_conv_pass(ConvPass pass, const at::Tensor& a, const at::Tensor& b, at::Tensor& out,
                     const ConvGeometry& geometry, std::string& why) {
  why.clear();
  if (cudnn_library() == nullptr) {
    static std::once_flag said;
    std::call_once(said, [&] { why = "libcudnn.so.9 could not be loaded"; });
    return false;
  }
  const int device = a.get_device();
  cudnnHandle_t handle = at::native::getCudnnHandle();
  // Through the frontend's shim: cuDNN's functions are found in the loaded library, not linked.
  TORCH_CHECK(fe::detail::set_stream(handle, at::cuda::getCurrentCUDAStream(device).stream()) ==
                  CUDNN_STATUS_SUCCESS,
              "cudnnSetStream failed");
  const std::string key = device_key(device) + " | " + shape_key(pass, a, b, out, geometry);
  Table& t = table();
  std::shared_ptr<PassPlan> plan;
  {
    // One thread times a shape while the others wait: timings taken side by side would be
    // each other's noise.
    std::lock_guard<std::mutex> lock(t.mutex);
    auto found = t.plans.find(key);
    if (found == t.plans.end()) {
      found = t.plans.emplace(key, plan_for(pass, a, b, out, geometry, key, handle, t)).first;
      if (!found->second->graph) {
        ++t.counts.refused;
        why = found->second->why_not;  // said once, where the shape was first seen
      }
    }
    plan = found->second;
    if (plan->job_noted != t.job) note_job(t, key, *plan);
  }
  if (!plan->graph) return false;
  at::Tensor workspace =
      at::empty({std::max<int64_t>(plan->workspace, 1)}, a.options().dtype(at::kByte));
  std::unordered_map<int64_t, void*> pack = {{kA, const_cast<void*>(a.const_data_ptr())},
                                             {kB, const_cast<void*>(b.const_data_ptr())},
                                             {kOut, out.mutable_data_ptr()}};
  // Thread-safe in the frontend: the variant pack is built on the caller's stack.
  fe::error_t e =
      plan->graph->execute_plan_at_index(handle, pack, workspace.mutable_data_ptr(), plan->index);
  TORCH_CHECK(e.is_good(), "cuDNN's convolution plan failed to run: ", e.get_message());
  return true;
}

ConvPlansSummary plan_counts() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.counts;
}

void clear_plans() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.plans.clear();
  t.choices.clear();
  t.counts = ConvPlansSummary{};
  t.unsaved = false;
}

void set_plans_job(const std::string& job) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.job = job;
}

bool plans_unsaved() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.unsaved;
}

int64_t prebuild_plans(const std::string& job, int threads, bool warm_kernels) {
  if (job.empty() || cudnn_library() == nullptr || !at::cuda::is_available()) return 0;
  const auto started = std::chrono::steady_clock::now();
  const int device = c10::cuda::current_device();
  const std::string prefix = device_key(device) + " | ";
  Table& t = table();
  std::vector<std::pair<std::string, Choice>> wanted;  // copies: built outside the lock
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [key, c] : t.choices)
      if (c.operands && c.jobs.count(job) && key.compare(0, prefix.size(), prefix) == 0 &&
          !t.plans.count(key))
        wanted.emplace_back(key, c);
  }
  if (wanted.empty()) return 0;
  std::vector<std::shared_ptr<PassPlan>> built(wanted.size());
  std::vector<ConvPlansSummary> counts(std::clamp<size_t>(threads, 1, wanted.size()));
  std::atomic<size_t> next{0};
  // The caller's stream: the warm-up runs' scratch memory, freed in its order, is the step's to
  // reuse.
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(device);
  // Each worker on a cuDNN handle of its own (ATen's pool gives one a thread; a handle is not to
  // be shared between threads). Measured on an H100, the workers do not build side by side:
  // cuDNN's configuration of a plan and CUDA's loading of its kernels serialize whichever
  // thread asks (8 threads' listing seconds summed to ten times one thread's); what the threads
  // give is the kernels' loading overlapping the configuration (docs/notes/wall-clock.md).
  const auto work = [&](ConvPlansSummary& mine) {
    try {
      c10::cuda::CUDAStreamGuard guard(stream);
      cudnnHandle_t handle = at::native::getCudnnHandle();
      TORCH_CHECK(fe::detail::set_stream(handle, stream.stream()) == CUDNN_STATUS_SUCCESS,
                  "cudnnSetStream failed");
      for (size_t i; (i = next.fetch_add(1)) < wanted.size();) {
        std::string why;  // a plan that does not come back is left to its first call
        const Operands& o = *wanted[i].second.operands;
        built[i] = kept_plan(o, wanted[i].second, handle, mine, why);
        if (built[i]) run_once(*built[i], o, handle, device);
      }
    } catch (const std::exception&) {  // the rest are built where first used, as before
    }
  };
  // The step's other kernels loaded meanwhile, on one more thread (kernel_warmup.cpp): in the
  // plans' dtype, NHWC where their activations are.
  double warmup_seconds = 0.0;
  int64_t warmup_ops = 0;
  std::thread warmup;
  if (warm_kernels) {
    const Operands& o = *wanted.front().second.operands;
    const bool channels_last = o.a_strides.size() == 4 && o.a_sizes[1] > 1 && o.a_strides[1] == 1;
    warmup = std::thread([&, dtype = o.dtype, channels_last] {
      const auto began = std::chrono::steady_clock::now();
      warmup_ops = warm_step_kernels(device, dtype, channels_last);
      warmup_seconds = seconds_since(began);
    });
  }
  std::vector<std::thread> pool;
  for (size_t w = 1; w < counts.size(); ++w) pool.emplace_back(work, std::ref(counts[w]));
  work(counts[0]);
  for (auto& th : pool) th.join();
  if (warmup.joinable()) warmup.join();

  std::lock_guard<std::mutex> lock(t.mutex);
  int64_t added = 0;
  for (size_t i = 0; i < wanted.size(); ++i)
    if (built[i] && t.plans.emplace(wanted[i].first, built[i]).second) ++added;
  for (const ConvPlansSummary& c : counts) {
    t.counts.configured += c.configured;
    t.counts.from_compiled += c.from_compiled;
    t.counts.runtime_compiled += c.runtime_compiled;
    t.counts.listing_seconds += c.listing_seconds;
    t.counts.graph_seconds += c.graph_seconds;
    t.counts.building_seconds += c.building_seconds;
  }
  t.counts.from_file += added;
  t.counts.prebuilt += added;
  t.counts.rebuilding_seconds += seconds_since(started);
  t.counts.warmup_seconds += warmup_seconds;
  t.counts.warmup_ops += warmup_ops;
  return added;
}

// The file: {"format", "cudnn" (cuDNN's version), "frontend", "plans": {key: {"engine",
// "knobs": [[type, value]...], "us", "plan" (a runtime-compiled plan serialized with its code,
// where kept), "operands" (what makes the key: {"pass", "dtype", "a", "b", "out": [sizes,
// strides], "stride", "padding", "dilation"}), "jobs" (the jobs that used it)}}}. Keys name the
// GPU, so one file serves several. "operands" and "jobs" are absent from an older build's
// file, whose plans are then built where first used.
int64_t load_plan_choices(const std::string& path, std::string& note) {
  note.clear();
  if (!fs::exists(path)) return 0;
  std::string why;
  const auto bytes = fs::read_file(path, &why);
  if (!bytes) {
    note = path + " could not be read (" + why + ")";
    return 0;
  }
  if (cudnn_library() == nullptr) {
    note = "libcudnn.so.9 could not be loaded";
    return 0;
  }
  std::map<std::string, Choice> read;
  try {
    const auto j = nlohmann::json::parse(bytes->begin(), bytes->end());
    if (j.at("format").get<int>() != kFileFormat) {
      note = path + " is of another layout (format " + j.at("format").dump() + "): ignored";
      return 0;
    }
    const int64_t cudnn = static_cast<int64_t>(fe::detail::get_backend_version());
    if (j.at("cudnn").get<int64_t>() != cudnn ||
        j.at("frontend").get<int64_t>() != CUDNN_FRONTEND_VERSION) {
      note = path + " was written with cuDNN " + j.at("cudnn").dump() + " and frontend " +
             j.at("frontend").dump() + " (this process has " + std::to_string(cudnn) + " and " +
             std::to_string(CUDNN_FRONTEND_VERSION) + "): ignored";
      return 0;
    }
    for (const auto& [key, v] : j.at("plans").items()) {
      Choice c;
      c.engine = v.at("engine").get<int64_t>();
      for (const auto& kv : v.at("knobs"))
        c.knobs.emplace_back(kv.at(0).get<int64_t>(), kv.at(1).get<int64_t>());
      c.microseconds = v.value("us", 0.0);
      if (const auto found = v.find("plan"); found != v.end() && found->is_object())
        c.serialized = *found;
      if (const auto found = v.find("operands"); found != v.end())
        c.operands = operands_from(*found, key);
      if (const auto found = v.find("jobs"); found != v.end())
        c.jobs = found->get<std::set<std::string>>();
      read.emplace(key, std::move(c));
    }
  } catch (const nlohmann::json::exception& e) {
    note = path + " is not a plans file tandem wrote (" + e.what() + "): ignored";
    return 0;
  }
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (auto& [key, c] : read) {
    auto [mine, added] = t.choices.emplace(key, c);
    if (added) continue;  // this process's pick wins; the file's notes join it
    mine->second.jobs.insert(c.jobs.begin(), c.jobs.end());
    if (!mine->second.operands) mine->second.operands = c.operands;
  }
  return static_cast<int64_t>(read.size());
}

bool save_plan_choices(const std::string& path, std::string& error) {
  if (cudnn_library() == nullptr) {
    error = "libcudnn.so.9 could not be loaded";
    return false;
  }
  nlohmann::json j = {{"format", kFileFormat},
                      {"cudnn", static_cast<int64_t>(fe::detail::get_backend_version())},
                      {"frontend", CUDNN_FRONTEND_VERSION},
                      {"plans", nlohmann::json::object()}};
  {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [key, c] : t.choices) {
      nlohmann::json& entry = j["plans"][key];
      entry = {{"engine", c.engine}, {"knobs", c.knobs}, {"us", c.microseconds}};
      if (c.serialized.is_object()) entry["plan"] = c.serialized;
      if (c.operands) entry["operands"] = to_json(*c.operands);
      if (!c.jobs.empty()) entry["jobs"] = c.jobs;
    }
    t.unsaved = false;  // what this snapshot holds; a note made while writing sets it again
  }
  // The temporary named by the process: two processes of one job (ranks on one machine) may
  // save at once.
  try {
    fs::make_dirs(fs::parent_of(path));
    fs::write_file_atomic(path, j.dump(1), path + ".tmp" + std::to_string(::getpid()));
  } catch (const std::exception& e) {
    error = e.what();
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.unsaved = true;  // not written: still the file's to take
    return false;
  }
  return true;
}

}  // namespace tandem::models::detail

#else  // no cuDNN frontend in this build: no plans, LibTorch's convolution everywhere

namespace tandem::models::detail {

bool cudnn_conv_pass(ConvPass, const at::Tensor&, const at::Tensor&, at::Tensor&,
                     const ConvGeometry&, std::string& why) {
  why.clear();
  return false;
}
ConvPlansSummary plan_counts() { return {}; }
int64_t load_plan_choices(const std::string&, std::string& note) {
  note = "this build has no cuDNN graphs";
  return 0;
}
bool save_plan_choices(const std::string&, std::string& error) {
  error = "this build has no cuDNN graphs";
  return false;
}
void clear_plans() {}
void set_plans_job(const std::string&) {}
bool plans_unsaved() { return false; }
int64_t prebuild_plans(const std::string&, int, bool) { return 0; }

}  // namespace tandem::models::detail

#endif
