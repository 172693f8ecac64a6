// A lane is where one stage of a training step runs: a named CUDA stream taken from LibTorch's
// pool, or, on a machine without CUDA, simply the calling thread (so every mode still runs).
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <string>

namespace tandem {

/// The device tandem runs on when the user says "auto": the first CUDA device if there is one.
c10::Device default_device();

/// Parses "auto", "cpu", "cuda" or "cuda:N"; throws InvalidArgument naming the bad value.
c10::Device parse_device(const std::string& text);

/// Scheduling priority of a lane's stream. When two lanes' kernels compete for the GPU, blocks
/// of the high-priority lane are dispatched first: give it to the critical path (the training
/// step) so the lanes that feed it fill the gaps instead of stretching it.
enum class LanePriority { kNormal, kHigh };

class Lane {
 public:
  /// A lane with its own stream from LibTorch's pool on `device` (CUDA), or the calling thread
  /// (CPU). Note: the pool hands out 32 streams per priority round-robin, so lanes created far
  /// apart may share a stream; that only loses overlap, never correctness.
  static Lane create(std::string name, c10::Device device,
                     LanePriority priority = LanePriority::kNormal);
  /// The device's current stream (the default stream unless a guard changed it) as a lane.
  static Lane current(std::string name, c10::Device device);

  const std::string& name() const { return name_; }
  c10::Device device() const { return device_; }
  bool is_cuda() const { return stream_.has_value(); }
  /// The lane's stream; only valid when is_cuda().
  c10::cuda::CUDAStream stream() const;

  /// Device-side: work enqueued on this lane from now on waits for all work already enqueued
  /// on `other`. No host sync. A no-op on CPU or when both lanes are the same stream.
  void wait_for(const Lane& other) const;
  /// Host-side: blocks until everything enqueued on this lane has finished.
  void synchronize() const;

  bool same_stream(const Lane& other) const;

 private:
  Lane(std::string name, c10::Device device, std::optional<c10::cuda::CUDAStream> stream)
      : name_(std::move(name)), device_(device), stream_(stream) {}

  std::string name_;
  c10::Device device_;
  std::optional<c10::cuda::CUDAStream> stream_;
};

/// Makes `lane` the current device and stream for LibTorch ops in this scope, and opens an NVTX
/// range named "<lane>/<what>" so Nsight Systems shows the stage. On CPU it only opens the range.
class LaneGuard {
 public:
  explicit LaneGuard(const Lane& lane, const char* what = nullptr);
  ~LaneGuard();
  LaneGuard(const LaneGuard&) = delete;
  LaneGuard& operator=(const LaneGuard&) = delete;

 private:
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};

}  // namespace tandem
