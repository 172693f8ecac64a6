// EngineCropsAhead: an evaluation's JPEG-engine rows decoded on a thread and stream of their
// own, one batch at a time, while the evaluation's thread loads the next batch's parts from the
// CPU workers and runs the forward of the one before.
//
// Why: the evaluation's thread decoded each batch's engine rows itself, after the batch's last
// part came in: the workers' time and the engines' time added up instead of overlapping (750
// held-out photos of 1000-2000 px: 3,195 img/s, about the sum's prediction of 3,260, where the
// two sides side by side would give ~5,300).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <future>
#include <utility>
#include <vector>

#include "tandem/data/engine_split.h"
#include "tandem/detail/lane.h"
#include "tandem/resized_crop.h"

namespace tandem::train::detail {

class EngineCropsAhead {
 public:
  /// Crops by `spec` (its boxes drawn on the device for the decoded sizes) of the rows left to
  /// `split`'s engines, in batches of `batch_size` (for the share's rebalance).
  EngineCropsAhead(ResizedCropSpec spec, data::EngineSplit split, c10::Device device,
                   int64_t batch_size)
      : spec_(std::move(spec)),
        split_(std::move(split)),
        device_(device),
        batch_size_(batch_size),
        lane_(Lane::create("eval-engines", device)) {}
  EngineCropsAhead(const EngineCropsAhead&) = delete;
  EngineCropsAhead& operator=(const EngineCropsAhead&) = delete;
  ~EngineCropsAhead() {
    if (job_.valid()) job_.wait();  // its bytes and decoder stay until it is done
  }

  /// Starts decoding `encoded` (pointers into `bytes`, kept until the decode is done). One at
  /// a time: the last one started must have been finished (the decoder is one thread's).
  void start(std::vector<data::EncodedImage> encoded, std::vector<at::Tensor> bytes) {
    TORCH_CHECK(!job_.valid(), "EngineCropsAhead: a decode is still pending");
    job_ = std::async(std::launch::async,
                      [this, encoded = std::move(encoded), bytes = std::move(bytes)]() {
                        LaneGuard guard(lane_, "engine crops");
                        at::NoGradGuard no_grad;
                        return data::engine_crops(spec_, split_, encoded, device_, batch_size_);
                      });
  }

  /// Waits for a started decode, if any, and drops it and its error (an evaluation that
  /// stopped before taking it).
  void drop() noexcept {
    if (!job_.valid()) return;
    try {
      job_.get();
    } catch (...) {
    }
  }

  /// Waits for the started decode (rethrowing its error) and returns its crops, (N, C, out_h,
  /// out_w) float, for work on `lane`: the lane waits for the decode's stream, and the crops'
  /// memory is not reused before the lane's work on them is done.
  at::Tensor finish(const Lane& lane) {
    TORCH_CHECK(job_.valid(), "EngineCropsAhead: no decode started");
    at::Tensor x = job_.get();
    lane.wait_for(lane_);
    if (lane.is_cuda()) x.record_stream(lane.stream());
    return x;
  }

 private:
  ResizedCropSpec spec_;
  data::EngineSplit split_;
  c10::Device device_;
  int64_t batch_size_;
  Lane lane_;
  std::future<at::Tensor> job_;
};

}  // namespace tandem::train::detail
