// GraphedStep: warm-up, capture with a diagnosis of failures, replay.
#include "graph.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "tandem/error.h"

namespace tandem {

namespace detail {
// LibTorch 2.11's CUDAGraph::capture_end throws as soon as cudaStreamEndCapture fails (a host
// sync invalidated the capture), before it stops routing allocations to the graph's pool: both
// caching allocators would keep, for good, a routing filter that points into the destroyed
// graph, and while any such entry exists the device allocator defers every free of a block
// used on another stream (all of a pipeline's handed-off batches). The pool id and device are
// protected members of CUDAGraph, hence this subclass.
struct CapturedGraph : at::cuda::CUDAGraph {
  // Keeps the captured cudaGraph_t after capture_end, which then does not instantiate:
  // instantiate_at_stream_priority() does.
  CapturedGraph() : at::cuda::CUDAGraph(/*keep_graph=*/true) {}

  /// CUDAGraph::instantiate() of LibTorch 2.11 without cudaGraphInstantiateFlagUseNodePriority:
  /// replays run at the priority of the stream they are launched into (GraphedStep::capture).
  /// AutoFreeOnLaunch as there: tensors not freed between replays keep the graph's bookkeeping
  /// valid under the cudaMallocAsync allocator backend. Once, after a successful capture_end.
  void instantiate_at_stream_priority() {
    TORCH_INTERNAL_ASSERT(capture_ended_ && has_graph_ && !has_graph_exec_);
    TANDEM_CUDA_CHECK(cudaGraphInstantiateWithFlags(&graph_exec_, graph_,
                                                    cudaGraphInstantiateFlagAutoFreeOnLaunch));
    has_graph_exec_ = true;
  }
  /// After a failed capture_end: stop the routing and release the pool, as capture_end and
  /// reset() would have. Never throws (the original failure is what gets reported).
  void unwind_failed_end() {
    if (capture_ended_) return;  // capture_end got past the routing: reset() releases the pool
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_);
      c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_);
    } catch (...) {
    }
    try {
      at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_);
      at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_);
    } catch (...) {
    }
    cudaGetLastError();
  }
};
}  // namespace detail

namespace {

// Serializes capture, replay and destruction of every graph of the process: see GraphedStep's
// class comment for the LibTorch state (the default CUDA generator's) that makes this necessary.
std::mutex& graph_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The usual reasons a capture fails, keyed by what CUDA or LibTorch says.
std::string likely_cause(const std::string& what) {
  if (what.find("out of memory") != std::string::npos)
    return "the device ran out of memory during capture (a smaller batch size; memory cached "
           "by the allocator cannot be released while a capture is under way)";
  if (what.find("unjoined") != std::string::npos || what.find("Unjoined") != std::string::npos)
    return "a side stream forked inside the step was not joined back before it ended";
  if (what.find("not in capture mode") != std::string::npos)
    return "random numbers drawn from a generator not registered with the graph "
           "(list it in GraphOptions::generators)";
  if (what.find("not permitted when stream is capturing") != std::string::npos ||
      what.find("operation not permitted") != std::string::npos ||
      what.find("invalidated") != std::string::npos || what.find("synchron") != std::string::npos)
    return "a host synchronization inside the step (.item(), .cpu(), printing a tensor, "
           "a blocking copy or an explicit synchronize)";
  return "an operation that cannot be captured (host sync, CPU tensor, data-dependent shape)";
}

// LibTorch 2.11 ends each registered generator's capture (CUDAGraph::capture_end's epilogue)
// only after the stream capture itself ended cleanly. When it did not (a host sync invalidated
// the capture), the default CUDA generator — registered with every graph — stays marked
// "capturing", and every later random draw or replay in the process fails with "Offset increment
// outside graph capture encountered unexpectedly". A clean capture of a trivial kernel, with the
// same generators registered, runs that epilogue. Called on the lane, under the graph mutex.
void end_generator_captures(const Lane& lane, const std::vector<at::Generator>& generators) {
  try {
    at::cuda::CUDAGraph repair;
    for (const at::Generator& g : generators) repair.register_generator_state(g);
    repair.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    at::zeros({1}, at::TensorOptions().device(lane.device()));  // a kernel: not an empty graph
    repair.capture_end();
  } catch (...) {
    cudaGetLastError();  // nothing more to do: the original failure is what gets reported
  }
}

}  // namespace

GraphedStep::GraphedStep(GraphOptions options) : options_(std::move(options)) {}

GraphedStep::~GraphedStep() {
  std::lock_guard<std::mutex> lock(graph_mutex());
  graph_.reset();
}

void GraphedStep::capture(const Lane& lane, const std::function<void()>& body) {
  TANDEM_CHECK_ARG(lane.is_cuda(), "stage '", options_.name,
                   "': CUDA graphs need a CUDA lane, got lane '", lane.name(), "' on ",
                   lane.device());
  for (size_t i = 0; i < options_.static_tensors.size(); ++i) {
    const at::Tensor& t = options_.static_tensors[i];
    TANDEM_CHECK_ARG(t.defined() && t.is_cuda() && t.device() == lane.device(), "stage '",
                     options_.name, "': static tensor ", i, " is on ",
                     t.defined() ? t.device().str() : std::string("nothing"), ", expected ",
                     lane.device(),
                     " (work on a CPU tensor runs once at capture, never at replay)");
  }
  for (size_t i = 0; i < options_.generators.size(); ++i) {
    const at::Generator& g = options_.generators[i];
    TANDEM_CHECK_ARG(g.defined() && g.device().is_cuda(), "stage '", options_.name, "': generator ",
                     i, " is ", g.defined() ? g.device().str() : "undefined",
                     ", expected a CUDA generator (only those advance under replay)");
  }
  std::lock_guard<std::mutex> lock(graph_mutex());
  const auto started = std::chrono::steady_clock::now();  // after another stage's capture
  graph_ = std::make_unique<detail::CapturedGraph>();
  captured_ = false;
  LaneGuard guard(lane, "capture");
  // Before capture_begin, which resets each registered generator's in-graph offset.
  for (const at::Generator& g : options_.generators) graph_->register_generator_state(g);
  graph_->capture_begin(options_.pool, options_.mode);
  // Drops the half-made graph and reports which stage failed, where, and the likely cause.
  auto fail = [&](const char* where, const std::string& what) {
    graph_.reset();
    cudaGetLastError();  // clear the capture error, if any, for the next caller
    return GraphCaptureError("stage '" + options_.name + "': capture failed" + where + ": " +
                             first_line(what) + " — likely cause: " + likely_cause(what));
  };
  try {
    body();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    bool ended = false;
    try {
      graph_->capture_end();  // ends the stream capture and the allocator's routing
      ended = true;
    } catch (...) {
      graph_->unwind_failed_end();
    }
    GraphCaptureError error = fail("", what);
    if (!ended) end_generator_captures(lane, options_.generators);
    throw error;
  }
  try {
    graph_->capture_end();
  } catch (const std::exception& e) {
    graph_->unwind_failed_end();
    GraphCaptureError error = fail(" at its end", e.what());
    end_generator_captures(lane, options_.generators);
    throw error;
  }
  try {
    graph_->instantiate_at_stream_priority();
  } catch (const std::exception& e) {
    throw fail(" at its instantiation", e.what());
  }
  captured_ = true;
  capture_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void GraphedStep::replay(const Lane& lane) {
  TORCH_CHECK(captured_, "stage '", options_.name, "': replay before a successful capture");
  std::lock_guard<std::mutex> lock(graph_mutex());
  LaneGuard guard(lane, "replay");
  graph_->replay();
}

unsigned long long GraphedStep::instantiate_flags() const {
  TORCH_CHECK(captured_, "stage '", options_.name,
              "': instantiate_flags() before a successful capture");
  unsigned long long flags = 0;
  TANDEM_CUDA_CHECK(cudaGraphExecGetFlags(graph_->raw_cuda_graph_exec(), &flags));
  return flags;
}

at::cuda::MempoolId_t GraphedStep::pool() {
  TORCH_CHECK(captured_, "stage '", options_.name, "': pool() before a successful capture");
  return graph_->pool();
}

void warm_up_on_side_lane(const Lane& lane, int iterations, const std::function<void(int)>& body) {
  const Lane side = Lane::create(lane.name() + "-warmup", lane.device());
  side.wait_for(lane);
  {
    LaneGuard guard(side, "warm-up");
    for (int i = 0; i < iterations; ++i) body(i);
  }
  lane.wait_for(side);
}

bool copy_into_static(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.sizes().equals(src.sizes())) return false;
  dst.copy_(src, /*non_blocking=*/true);
  return true;
}

}  // namespace tandem
