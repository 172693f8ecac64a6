// GraphedStep: warm-up, capture with a diagnosis of failures, replay; GraphedStage: a pipeline
// stage's warm-up / capture / replay / eager-fallback life cycle.
#include "tandem/graph.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <mutex>
#include <sstream>

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

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
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
                     t.defined() ? t.device().str() : std::string("nothing"),
                     ", expected ", lane.device(),
                     " (work on a CPU tensor runs once at capture, never at replay)");
  }
  for (size_t i = 0; i < options_.generators.size(); ++i) {
    const at::Generator& g = options_.generators[i];
    TANDEM_CHECK_ARG(g.defined() && g.device().is_cuda(), "stage '", options_.name,
                     "': generator ", i, " is ", g.defined() ? g.device().str() : "undefined",
                     ", expected a CUDA generator (only those advance under replay)");
  }
  std::lock_guard<std::mutex> lock(graph_mutex());
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
  captured_ = true;
}

void GraphedStep::replay(const Lane& lane) {
  TORCH_CHECK(captured_, "stage '", options_.name, "': replay before a successful capture");
  std::lock_guard<std::mutex> lock(graph_mutex());
  LaneGuard guard(lane, "replay");
  graph_->replay();
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

void WarmupBarrier::join() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++pending_;
}

void WarmupBarrier::arrive() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --pending_;
  }
  done_.notify_all();
}

void WarmupBarrier::wait(const std::string& stage) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Bounded: a stage that died in its warm-up without arriving must not hang the pipeline (its
  // own error, recorded first, is what the pipeline reports).
  if (!done_.wait_for(lock, std::chrono::minutes(5), [&] { return pending_ <= 0; }))
    throw std::runtime_error("stage '" + stage +
                             "' waited 5 minutes for the other graphed stages to finish their "
                             "warm-up: did one of them fail?");
}

GraphedStage::GraphedStage(GraphOptions options, Work work, GraphOutputs outputs,
                           int warmup_steps)
    : options_(std::move(options)),
      work_(std::move(work)),
      outputs_(outputs),
      warmup_(warmup_steps) {
  TANDEM_CHECK_ARG(warmup_steps >= 0, "stage '", options_.name, "': warm-up step count ",
                   warmup_steps, " is not valid: expected >= 0");
  TORCH_CHECK(work_, "stage '", options_.name, "' has no work");
  if (options_.warmup_barrier && warmup_ > 0) {
    options_.warmup_barrier->join();
    barrier_pending_ = true;
  }
}

GraphedStage::~GraphedStage() {
  if (barrier_pending_) options_.warmup_barrier->arrive();  // never wait for a stage that is gone
}

std::vector<at::Tensor> GraphedStage::run(const Lane& lane, int64_t item,
                                          const std::vector<at::Tensor>& inputs) {
  const int64_t call = calls_++;
  if (!lane.is_cuda()) {
    on_cpu_ = true;
    return work_(inputs);
  }
  if (call < warmup_) {
    // PyTorch's recipe: warm up on a side lane, ordered between the lane's work before and
    // after. One side lane for all warm-ups, so libraries set up per-stream state once.
    if (!side_) side_ = Lane::create(lane.name() + "-warmup", lane.device());
    side_->wait_for(lane);
    std::vector<at::Tensor> out;
    try {
      LaneGuard guard(*side_, "warm-up");
      out = work_(inputs);
    } catch (...) {
      if (barrier_pending_) {  // this stage will not finish its warm-up: release the others
        options_.warmup_barrier->arrive();
        barrier_pending_ = false;
      }
      throw;
    }
    lane.wait_for(*side_);
    if (barrier_pending_ && call + 1 == warmup_) {
      options_.warmup_barrier->arrive();
      barrier_pending_ = false;
    }
    // The outputs were allocated on the side lane and are read next on `lane` (and handed on
    // from there): without this the allocator could recycle them for the side lane's next
    // allocation while `lane` still reads them.
    for (const at::Tensor& t : out)
      if (t.defined() && t.is_cuda() && t.has_storage() && t.storage().data_ptr().get())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), lane.stream());
    return out;
  }
  LaneGuard guard(lane, "graph inputs");
  if (!captured()) {
    // The statics take the shapes, dtypes and strides of the first item after warm-up, so the
    // captured kernels see exactly the layouts the eager steps saw (and pick the same kernels).
    static_inputs_.clear();
    for (const at::Tensor& t : inputs) static_inputs_.push_back(at::empty_like(t));
  }
  bool same_shapes = inputs.size() == static_inputs_.size();
  for (size_t i = 0; same_shapes && i < inputs.size(); ++i)
    same_shapes = inputs[i].sizes().equals(static_inputs_[i].sizes());
  if (!same_shapes) {
    if (eager_items_.empty()) {
      std::ostringstream os;
      for (size_t i = 0; i < inputs.size(); ++i)
        if (i >= static_inputs_.size() || !inputs[i].sizes().equals(static_inputs_[i].sizes())) {
          os << "input " << i << " is " << shape_of(inputs[i]) << ", captured "
             << (i < static_inputs_.size() ? shape_of(static_inputs_[i]) : "nothing");
          break;
        }
      eager_reason_ = os.str();
    }
    eager_items_.push_back(item);
    return work_(inputs);
  }
  for (size_t i = 0; i < inputs.size(); ++i) copy_into_static(static_inputs_[i], inputs[i]);
  if (!captured()) {
    if (options_.warmup_barrier) options_.warmup_barrier->wait(options_.name);
    GraphOptions o = options_;
    o.static_tensors.insert(o.static_tensors.end(), static_inputs_.begin(), static_inputs_.end());
    graph_ = std::make_unique<GraphedStep>(std::move(o));
    graph_->capture(lane, [&] { static_outputs_ = work_(static_inputs_); });
  }
  graph_->replay(lane);
  ++replays_;
  if (outputs_ == GraphOutputs::kStatic) return static_outputs_;
  std::vector<at::Tensor> out;
  out.reserve(static_outputs_.size());
  for (const at::Tensor& t : static_outputs_) out.push_back(t.clone());
  return out;
}

std::vector<std::string> GraphedStage::notes() const {
  std::vector<std::string> out;
  if (on_cpu_) return out;  // the scenario says once that its graphed mode ran eagerly
  if (!captured() && calls_ > 0 && calls_ <= warmup_)
    out.push_back(detail::concat(options_.name, ": all ", calls_,
                                 " step(s) ran eagerly: a graph is captured only after ", warmup_,
                                 " warm-up steps"));
  if (!eager_items_.empty()) {
    std::string items;
    for (size_t i = 0; i < eager_items_.size(); ++i)
      items += (i ? ", " : "") + std::to_string(eager_items_[i]);
    out.push_back(detail::concat(options_.name, ": step ", items,
                                 " ran eagerly: its shapes differ from the captured ones (",
                                 eager_reason_, "; a short last batch)"));
  }
  return out;
}

}  // namespace tandem
