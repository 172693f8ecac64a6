// GraphedStep: warm-up, capture with a diagnosis of failures, replay.
#include "tandem/graph.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include "tandem/error.h"

namespace tandem {

namespace {

// The usual reasons a capture fails, keyed by what CUDA or LibTorch says.
std::string likely_cause(const std::string& what) {
  if (what.find("unjoined") != std::string::npos || what.find("Unjoined") != std::string::npos)
    return "a side stream forked inside the step was not joined back before it ended";
  if (what.find("not permitted when stream is capturing") != std::string::npos ||
      what.find("operation not permitted") != std::string::npos ||
      what.find("invalidated") != std::string::npos || what.find("synchron") != std::string::npos)
    return "a host synchronization inside the step (.item(), .cpu(), printing a tensor, "
           "a blocking copy or an explicit synchronize)";
  return "an operation that cannot be captured (host sync, CPU tensor, data-dependent shape)";
}
}  // namespace

GraphedStep::GraphedStep(GraphOptions options) : options_(std::move(options)) {}

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
  graph_ = std::make_unique<at::cuda::CUDAGraph>();
  captured_ = false;
  LaneGuard guard(lane, "capture");
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
    try {
      graph_->capture_end();  // ends the stream capture and the allocator's routing
    } catch (...) {
    }
    throw fail("", what);
  }
  try {
    graph_->capture_end();
  } catch (const std::exception& e) {
    throw fail(" at its end", e.what());
  }
  captured_ = true;
}

void GraphedStep::replay(const Lane& lane) {
  TORCH_CHECK(captured_, "stage '", options_.name, "': replay before a successful capture");
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

}  // namespace tandem
