// GraphedStep: capture a step's device work once into a CUDA graph and replay it, removing the
// per-kernel launch cost. Warm-up runs eagerly on a side lane (so lazy initialization, cuDNN/
// cuBLAS handles and autotuning happen outside the graph), capture records — and does not
// execute — the work, and each replay re-runs exactly what was captured. GraphedStage
// (graphed_stage.h) wraps that life cycle for one stage of a pipeline.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/cuda/CUDAGraph.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/detail/lane.h"
#include "tandem/error.h"

namespace tandem {

namespace detail {
struct CapturedGraph;  // at::cuda::CUDAGraph, able to unwind a capture whose end failed
}  // namespace detail

/// Capture failed; what() names the stage and the likely cause.
class GraphCaptureError : public Error {
 public:
  using Error::Error;
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
  ///
  /// The graph is instantiated to run at the priority of the stream each replay is launched
  /// into, as eager kernels do. LibTorch 2.11 instantiates with
  /// cudaGraphInstantiateFlagUseNodePriority instead: each kernel then runs at the priority
  /// recorded in its node, which CUDA treats as a scheduling hint among the graph's ready nodes.
  /// The nodes did carry the capturing lane's priority, yet on the H200 seg's decoder graph,
  /// replayed on a high-priority lane beside the encoder's, made pipelined+graphed 2.7% slower
  /// than eager pipelined at batch 8 (339–341 vs 347–351 steps/s); at the stream's priority it
  /// ran 365–367, 7.7% faster than at its nodes' (docs/notes/pipeline-and-graphs.md).
  void capture(const Lane& lane, const std::function<void()>& body);
  /// Enqueues the captured work on `lane` (after what is already there). Capture first.
  void replay(const Lane& lane);
  bool captured() const { return captured_; }
  /// Host seconds the last successful capture took: recording `body` and instantiating the
  /// graph (a wait for another stage's capture left out). What a run pays once per graph.
  double capture_seconds() const { return capture_seconds_; }
  /// The pool, to share with a graph captured after this one.
  at::cuda::MempoolId_t pool();
  /// The flags the executable graph was instantiated with (cudaGraphExecGetFlags). Capture
  /// first. See capture() on priorities.
  unsigned long long instantiate_flags() const;

 private:
  GraphOptions options_;
  std::unique_ptr<detail::CapturedGraph> graph_;
  bool captured_ = false;
  double capture_seconds_ = 0;
};

/// Runs `body` eagerly `iterations` times on a side lane of `lane`'s device, ordered after the
/// work on `lane` and before its later work: PyTorch's recipe for warming up before capture.
void warm_up_on_side_lane(const Lane& lane, int iterations, const std::function<void(int)>& body);

/// Copies `src` into the static tensor `dst` on the current stream; false (nothing copied) if
/// the shapes differ, e.g. a short last batch: the caller replays only on true.
bool copy_into_static(at::Tensor& dst, const at::Tensor& src);

}  // namespace tandem
