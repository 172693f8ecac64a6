// GraphedStage: a pipeline stage's warm-up / capture / replay / eager-fallback life cycle, and
// the WarmupBarrier its stages share.
#include "graphed_stage.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <chrono>
#include <sstream>

#include "tandem/error.h"

namespace tandem {

namespace {
std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}
}  // namespace

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

void WarmupBarrier::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
  }
  done_.notify_all();
}

bool WarmupBarrier::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

void WarmupBarrier::wait(const std::string& stage) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Bounded even without cancel(): a stage that died in its warm-up without arriving must not
  // hang the pipeline (its own error, recorded first, is what the pipeline reports).
  const bool woken =
      done_.wait_for(lock, std::chrono::minutes(5), [&] { return cancelled_ || pending_ <= 0; });
  if (cancelled_)  // checked first: a cancelled barrier stays cancelled
    throw Error("stage '" + stage +
                "' stopped waiting for the other graphed stages' warm-up: another stage failed");
  if (!woken)
    throw Error("stage '" + stage +
                "' waited 5 minutes for the other graphed stages to finish their warm-up: did "
                "one of them fail?");
}

GraphedStage::GraphedStage(GraphOptions options, Work work, GraphOutputs outputs,
                           std::shared_ptr<WarmupBarrier> barrier, int warmup_steps)
    : options_(std::move(options)),
      work_(std::move(work)),
      outputs_(outputs),
      warmup_(warmup_steps),
      barrier_(std::move(barrier)) {
  TANDEM_CHECK_ARG(warmup_steps >= 0, "stage '", options_.name, "': warm-up step count ",
                   warmup_steps, " is not valid: expected >= 0");
  TORCH_CHECK(work_, "stage '", options_.name, "' has no work");
  if (barrier_ && warmup_ > 0) {
    barrier_->join();
    barrier_pending_ = true;
  }
}

GraphedStage::~GraphedStage() {
  release_barrier();  // never wait for a stage that is gone
}

void GraphedStage::release_barrier() {
  if (!barrier_pending_) return;
  barrier_->arrive();
  barrier_pending_ = false;
}

void GraphedStage::begin_run() {
  kept_ = captured();
  run_calls_ = run_replays_ = 0;
  eager_items_.clear();
  eager_reason_.clear();
}

std::vector<at::Tensor> GraphedStage::run(const Lane& lane, int64_t item,
                                          const std::vector<at::Tensor>& inputs) {
  const int64_t call = calls_++;
  ++run_calls_;
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
      release_barrier();  // this stage will not finish its warm-up: release the others
      throw;
    }
    lane.wait_for(*side_);
    if (call + 1 == warmup_) release_barrier();
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
    if (barrier_) barrier_->wait(options_.name);
    GraphOptions o = options_;
    o.static_tensors.insert(o.static_tensors.end(), static_inputs_.begin(), static_inputs_.end());
    graph_ = std::make_unique<GraphedStep>(std::move(o));
    graph_->capture(lane, [&] { static_outputs_ = work_(static_inputs_); });
  }
  graph_->replay(lane);
  ++replays_;
  ++run_replays_;
  if (outputs_ == GraphOutputs::kStatic) return static_outputs_;
  std::vector<at::Tensor> out;
  out.reserve(static_outputs_.size());
  for (const at::Tensor& t : static_outputs_) out.push_back(t.clone());
  return out;
}

std::vector<std::string> GraphedStage::notes() const {
  std::vector<std::string> out;
  if (on_cpu_) return out;  // the runner says once that its graphed mode ran eagerly
  if (!captured() && run_calls_ > 0 && calls_ <= warmup_)
    out.push_back(detail::concat(options_.name, ": all ", run_calls_,
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
