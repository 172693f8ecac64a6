// GraphedStep: capture a step's device work once into a CUDA graph and replay it, removing the
// per-kernel launch cost. Warm-up runs eagerly on a side lane (so lazy initialization, cuDNN/
// cuBLAS handles and autotuning happen outside the graph), capture records — and does not
// execute — the work, and each replay re-runs exactly what was captured.
#pragma once

#include <ATen/cuda/CUDAGraph.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/lane.h"

namespace tandem {

/// Capture failed; what() names the stage and the likely cause.
class GraphCaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct GraphOptions {
  std::string name = "step";  ///< the stage, for error messages
  /// Memory pool: {0, 0} gives the graph a private pool; graphs that replay in a fixed order
  /// may share one (at::cuda::graph_pool_handle(), or another graph's pool()).
  at::cuda::MempoolId_t pool = {0, 0};
  /// ThreadLocal: other host threads (loader workers waiting on events) may keep making CUDA
  /// calls while this thread captures; the capturing thread itself may not sync.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  /// Tensors the captured work reads or writes across replays: they must be CUDA tensors on the
  /// lane's device (a CPU tensor's work would run once on the host at capture, not per replay).
  std::vector<at::Tensor> static_tensors;
};

///   lane:   ... ──[capture: records body, runs nothing]── ... ──[replay]──[replay]── ...
///
/// The body must be capture-safe: no host sync (.item(), .cpu(), printing a tensor), no CPU
/// tensors in the work, the same shapes every time, and every side stream it forks joined back
/// before it returns. Captured allocations come from the graph's pool and keep their addresses,
/// so tensors the body creates (e.g. gradients allocated by backward) are rewritten — not
/// accumulated — by each replay.
class GraphedStep {
 public:
  explicit GraphedStep(GraphOptions options = {});

  /// Records `body` (called once, on `lane`, which must be a CUDA lane) into the graph. Throws
  /// GraphCaptureError naming the stage and the likely cause, and leaves the lane usable.
  void capture(const Lane& lane, const std::function<void()>& body);
  /// Enqueues the captured work on `lane` (after what is already there). Capture first.
  void replay(const Lane& lane);
  bool captured() const { return captured_; }
  /// The pool, to share with a graph captured after this one.
  at::cuda::MempoolId_t pool();

 private:
  GraphOptions options_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  bool captured_ = false;
};

/// Runs `body` eagerly `iterations` times on a side lane of `lane`'s device, ordered after the
/// work on `lane` and before its later work: PyTorch's recipe for warming up before capture.
void warm_up_on_side_lane(const Lane& lane, int iterations, const std::function<void(int)>& body);

/// Copies `src` into the static tensor `dst` on the current stream; false (nothing copied) if
/// the shapes differ, e.g. a short last batch: the caller replays only on true.
bool copy_into_static(at::Tensor& dst, const at::Tensor& src);

}  // namespace tandem
