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
#include <c10/util/Exception.h>
#include <cudnn_frontend.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "cudnn_conv_graphs.h"
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
};

// One shape's graph with the plan it runs (index into the graph's plans).
struct PassPlan {
  std::shared_ptr<fe::graph::Graph> graph;  // null where cuDNN has no plan for the shape
  int64_t index = -1;
  int64_t workspace = 0;
  std::string why_not;
};

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<PassPlan>> plans;  // by device and shape
  std::map<std::string, Choice> choices;  // timed here or loaded: what a save writes
  ConvPlansSummary counts;
};

Table& table() {
  static auto* t = new Table;  // never destroyed: threads may convolve during exit
  return *t;
}

std::vector<int64_t> vec(at::IntArrayRef a) { return {a.begin(), a.end()}; }

fe::DataType_t data_type(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::string device_key(int device) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(device);
  return std::string(p->name) + " sm" + std::to_string(p->major * 10 + p->minor);
}

// What decides a pass's plan: the pass, dtype, every tensor's sizes and strides, the geometry.
std::string shape_key(ConvPass pass, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& out, const ConvGeometry& g) {
  static const char* const kPass[] = {"fprop", "dgrad", "wgrad"};
  std::ostringstream k;
  k << kPass[static_cast<int>(pass)] << ' ' << a.scalar_type() << ' ' << a.sizes() << a.strides()
    << ' ' << b.sizes() << b.strides() << ' ' << out.sizes() << out.strides() << " s" << g.stride
    << " p" << g.padding << " d" << g.dilation;
  return k.str();
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const at::Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(vec(t.sizes()))
                      .set_stride(vec(t.strides()))
                      .set_data_type(data_type(t)));
}

// The pass's operation graph, built as far as its engines' list.
std::shared_ptr<fe::graph::Graph> operation_graph(ConvPass pass, const at::Tensor& a,
                                                  const at::Tensor& b, const at::Tensor& out,
                                                  const ConvGeometry& geo, cudnnHandle_t handle,
                                                  std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(data_type(a))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // The three passes' attributes differ in type only.
  auto geometry = [&](auto attributes, const char* name) {
    attributes.set_name(name)
        .set_padding(vec(geo.padding))
        .set_stride(vec(geo.stride))
        .set_dilation(vec(geo.dilation));
    return attributes;
  };
  std::shared_ptr<fe::graph::Tensor_attributes> result;
  switch (pass) {
    case ConvPass::kForward:
      result = g->conv_fprop(input(*g, "x", kA, a), input(*g, "w", kB, b),
                             geometry(fe::graph::Conv_fprop_attributes(), "fprop"));
      break;
    case ConvPass::kInputGrad:
      result = g->conv_dgrad(input(*g, "dy", kA, a), input(*g, "w", kB, b),
                             geometry(fe::graph::Conv_dgrad_attributes(), "dgrad"));
      break;
    case ConvPass::kWeightGrad:
      result = g->conv_wgrad(input(*g, "dy", kA, a), input(*g, "x", kB, b),
                             geometry(fe::graph::Conv_wgrad_attributes(), "wgrad"));
      break;
  }
  result->set_output(true)
      .set_uid(kOut)
      .set_dim(vec(out.sizes()))
      .set_stride(vec(out.strides()))
      .set_data_type(data_type(out));
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

// The shape's plan: rebuilt from a kept choice, or timed among cuDNN's candidates (while
// capturing, cuDNN's first choice untimed: nothing may synchronize then).
std::shared_ptr<PassPlan> plan_for(ConvPass pass, const at::Tensor& a, const at::Tensor& b,
                                   at::Tensor& out, const ConvGeometry& geo, const std::string& key,
                                   cudnnHandle_t handle, Table& t) {
  auto plan = std::make_shared<PassPlan>();
  const auto started = std::chrono::steady_clock::now();
  const auto graph = [&] {
    const double before = t.counts.graph_seconds;
    auto built = timed(t.counts.graph_seconds, [&] {
      return operation_graph(pass, a, b, out, geo, handle, plan->why_not);
    });
    t.counts.listing_seconds += t.counts.graph_seconds - before;  // a part of the listing
    return built;
  };
  const auto kept = t.choices.find(key);
  if (kept != t.choices.end()) {
    if ((plan->graph = deserialized(kept->second, handle, plan->workspace, t.counts))) {
      plan->index = 0;
      ++t.counts.from_file;
      t.counts.rebuilding_seconds += seconds_since(started);
      return plan;
    }
  }
  plan->graph = graph();
  if (!plan->graph) return plan;
  fe::graph::Graph& g = *plan->graph;

  if (kept != t.choices.end()) {
    std::string why;
    bool direct = false;
    if (const int64_t i = rebuild(g, kept->second, why, t.counts, direct); i >= 0) {
      if (g.get_workspace_size_plan_at_index(i, plan->workspace).is_good()) {
        plan->index = i;
        ++t.counts.from_file;
        t.counts.configured += direct;
        t.counts.runtime_compiled += runtime_compiled(g, i);  // compiled again
        t.counts.rebuilding_seconds += seconds_since(started);
        return plan;
      }
      why = "its workspace size was not given";
    }
    std::fprintf(stderr,
                 "tandem: a kept cuDNN plan for the convolution %s was not rebuilt (%s): timing "
                 "the candidates again\n",
                 key.c_str(), why.c_str());
    t.choices.erase(kept);
    plan->graph = graph();
    if (!plan->graph) return plan;
  }
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
      t.choices[key] = std::move(c);
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
}

// The file: {"format", "cudnn" (cuDNN's version), "frontend", "plans": {key: {"engine",
// "knobs": [[type, value]...], "us", "plan" (a runtime-compiled plan serialized with its code,
// where kept)}}}. Keys name the GPU, so one file serves several.
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
      read.emplace(key, std::move(c));
    }
  } catch (const nlohmann::json::exception& e) {
    note = path + " is not a plans file tandem wrote (" + e.what() + "): ignored";
    return 0;
  }
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (auto& [key, c] : read) t.choices.emplace(key, std::move(c));  // this process's picks win
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
      j["plans"][key] = {{"engine", c.engine}, {"knobs", c.knobs}, {"us", c.microseconds}};
      if (c.serialized.is_object()) j["plans"][key]["plan"] = c.serialized;
    }
  }
  // The temporary named by the process: two processes of one job (ranks on one machine) may
  // save at once.
  try {
    fs::make_dirs(fs::parent_of(path));
    fs::write_file_atomic(path, j.dump(1), path + ".tmp" + std::to_string(::getpid()));
  } catch (const std::exception& e) {
    error = e.what();
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

}  // namespace tandem::models::detail

#endif
