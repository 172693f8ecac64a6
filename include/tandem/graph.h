// GraphedStep: capture a step's device work once into a CUDA graph and replay it, removing the
// per-kernel launch cost. Warm-up runs eagerly on a side lane (so lazy initialization, cuDNN/
// cuBLAS handles and autotuning happen outside the graph), capture records — and does not
// execute — the work, and each replay re-runs exactly what was captured. GraphedStage wraps that
// life cycle (warm-up, capture, replay, eager fallback) for one stage of a pipeline.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/cuda/CUDAGraph.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/lane.h"

namespace tandem {

namespace detail {
struct CapturedGraph;  // at::cuda::CUDAGraph, able to unwind a capture whose end failed
}  // namespace detail

/// Capture failed; what() names the stage and the likely cause.
class GraphCaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Shared by the graphed stages of one pipeline, which capture on different host threads: no
/// stage captures before every stage has finished its eager warm-up steps. Why: eager first
/// steps may autotune cuDNN convolutions — LibTorch keeps its cuDNN benchmark cache per thread,
/// so each stage thread autotunes its own convolutions on its first steps — and autotuning
/// synchronizes the device, which CUDA refuses while any thread captures on that device
/// ("operation not permitted when stream is capturing"; seg's pipelined+graphed failed so at
/// batch 32 and 128 on the H200 before this barrier). No deadlock in a pipeline: a stage waiting
/// here has already handed its warm-up items downstream, and upstream stages are past theirs.
class WarmupBarrier {
 public:
  void join();     ///< a stage that will warm up before it captures
  void arrive();   ///< that stage finished its warm-up (or will never finish it)
  /// Blocks until every joined stage has arrived; throws after 5 minutes naming `stage`.
  void wait(const std::string& stage);
 private:
  std::mutex mutex_;
  std::condition_variable done_;
  int pending_ = 0;
};

struct GraphOptions {
  std::string name = "step";  ///< the stage, for error messages
  /// Memory pool: {0, 0} gives the graph a private pool; graphs that replay in a fixed order
  /// may share one (at::cuda::graph_pool_handle(), or another graph's pool()). Graphs that
  /// replay concurrently on different lanes must not: their intermediates would alias.
  at::cuda::MempoolId_t pool = {0, 0};
  /// ThreadLocal: other host threads (loader workers waiting on events, other stages) may keep
  /// making CUDA calls while this thread captures; the capturing thread itself may not sync.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  /// Tensors the captured work reads or writes across replays: they must be CUDA tensors on the
  /// lane's device (a CPU tensor's work would run once on the host at capture, not per replay).
  std::vector<at::Tensor> static_tensors;
  /// CUDA generators the captured work draws random numbers from, registered with the graph
  /// before capture (LibTorch registers the default CUDA generator itself). A registered
  /// generator's draws read its Philox offset on the device at replay, and each replay advances
  /// the offset by what the captured draws consumed: replays draw fresh numbers, the same
  /// sequence as eager draws of the same sizes. Drawing under capture from a generator not
  /// listed here fails the capture. While a graph that lists a generator captures, no other
  /// thread may draw from it (its draws would be taken for the graph's).
  std::vector<at::Generator> generators;
  /// GraphedStage only: the barrier of the pipeline's graphed stages (see WarmupBarrier).
  std::shared_ptr<WarmupBarrier> warmup_barrier;
};

///   lane:   ... ──[capture: records body, runs nothing]── ... ──[replay]──[replay]── ...
///
/// The body must be capture-safe: no host sync (.item(), .cpu(), printing a tensor), no CPU
/// tensors in the work, the same shapes every time, and every side stream it forks joined back
/// before it returns. Captured allocations come from the graph's pool and keep their addresses,
/// so tensors the body creates (e.g. gradients allocated by backward) are rewritten — not
/// accumulated — by each replay.
///
/// Threads: captures, replays and destruction of all GraphedSteps of the process are serialized
/// by one mutex. LibTorch 2.11 registers the default CUDA generator with every graph and marks
/// it "capturing" for the whole capture; a replay of another graph on another thread in that
/// window fails ("Offset increment outside graph capture encountered unexpectedly"), and the
/// generator's set of registered graphs is not synchronized. So in a pipeline whose stages
/// capture on their own threads, a stage's replay waits for another stage's capture (once).
/// For the same reason no other thread may draw from the default CUDA generator (dropout,
/// at::rand without a generator) while a graph captures; seg and cls draw from none (mlp does,
/// on its one thread).
class GraphedStep {
 public:
  explicit GraphedStep(GraphOptions options = {});
  ~GraphedStep();  // destroys the graph under the mutex (it unregisters from generators)
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  /// Records `body` (called once, on `lane`, which must be a CUDA lane) into the graph. Throws
  /// GraphCaptureError naming the stage and the likely cause, and leaves the lane — and the
  /// process's generators and caching allocators, which LibTorch leaves mid-capture when a host
  /// sync invalidated it — usable.
  void capture(const Lane& lane, const std::function<void()>& body);
  /// Enqueues the captured work on `lane` (after what is already there). Capture first.
  void replay(const Lane& lane);
  bool captured() const { return captured_; }
  /// The pool, to share with a graph captured after this one.
  at::cuda::MempoolId_t pool();

 private:
  GraphOptions options_;
  std::unique_ptr<detail::CapturedGraph> graph_;
  bool captured_ = false;
};

/// Runs `body` eagerly `iterations` times on a side lane of `lane`'s device, ordered after the
/// work on `lane` and before its later work: PyTorch's recipe for warming up before capture.
void warm_up_on_side_lane(const Lane& lane, int iterations, const std::function<void(int)>& body);

/// Copies `src` into the static tensor `dst` on the current stream; false (nothing copied) if
/// the shapes differ, e.g. a short last batch: the caller replays only on true.
bool copy_into_static(at::Tensor& dst, const at::Tensor& src);

/// Eager steps before a stage captures its graph: lazy initialization (cuDNN plans, cuBLAS
/// workspaces, optimizer state) happens in them, outside the graph.
constexpr int kGraphWarmupSteps = 3;

/// What GraphedStage::run returns after a replay.
enum class GraphOutputs {
  kStatic,  ///< the graph's own outputs, rewritten by the stage's next replay: read them on the
            ///< stage's lane before the stage runs again (e.g. copy a loss out)
  kCloned,  ///< fresh copies made on the stage's lane after the replay: safe to hand to another
            ///< lane (a Handoff's recordStream then keeps them alive while it reads them)
};

/// One pipeline stage whose device work runs as replays of a CUDA graph, on the stage's lane and
/// thread. Item by item (the stage's calls, in order):
///
///   items 0..W-1:  work(inputs) eagerly on a side lane — real steps, their results count
///   item W:        statics := empty_like(inputs); copy inputs in; capture work(statics); replay
///   later items:   copy inputs into the statics on the lane; replay
///   any later item whose inputs' shapes differ from the captured ones (a short last batch):
///                  work(inputs) eagerly on the lane, and notes() says so
///
/// On a CPU lane every item runs work(inputs) eagerly (there is nothing to capture). The copy
/// into the statics is ordered after the previous replay by the lane's stream, so one set of
/// statics suffices. Capture-safety rules are GraphedStep's. In a pipeline whose stages capture
/// on their own threads, no two stages (nor their warm-up lanes) may share a stream: work that
/// one thread enqueues on a stream another thread is capturing on would join — or break — that
/// capture. LibTorch's pool hands out 32 streams per priority round-robin, so the few lanes a
/// pipeline creates together are distinct.
class GraphedStage {
 public:
  /// The stage's device work: reads `inputs`, returns its outputs (the same number each call).
  using Work = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

  GraphedStage(GraphOptions options, Work work, GraphOutputs outputs = GraphOutputs::kStatic,
               int warmup_steps = kGraphWarmupSteps);
  ~GraphedStage();
  GraphedStage(const GraphedStage&) = delete;
  GraphedStage& operator=(const GraphedStage&) = delete;

  /// Runs item `item` (for notes) of the stage on `lane`, as the table above says, and returns
  /// the outputs: work's own after an eager step, else as GraphOutputs says.
  std::vector<at::Tensor> run(const Lane& lane, int64_t item,
                              const std::vector<at::Tensor>& inputs);

  const std::string& name() const { return options_.name; }
  int warmup_steps() const { return warmup_; }
  bool captured() const { return graph_ && graph_->captured(); }
  int64_t replays() const { return replays_; }
  /// Items after warm-up that ran eagerly because their shapes differed from the captured ones.
  const std::vector<int64_t>& eager_items() const { return eager_items_; }
  /// What a reader should know besides the capture itself: items that ran eagerly and why.
  std::vector<std::string> notes() const;

 private:
  GraphOptions options_;
  Work work_;
  GraphOutputs outputs_;
  int warmup_;
  std::optional<Lane> side_;            // the warm-up lane
  std::unique_ptr<GraphedStep> graph_;  // made at capture, when the statics exist
  std::vector<at::Tensor> static_inputs_, static_outputs_;
  int64_t calls_ = 0, replays_ = 0;
  bool on_cpu_ = false;
  bool barrier_pending_ = false;  // joined options_.warmup_barrier and not yet arrived
  std::vector<int64_t> eager_items_;
  std::string eager_reason_;  // the first mismatch: "input 0 is [3, ...], captured [8, ...]"
};

}  // namespace tandem
