// The image-folder classifier's evaluation: Resize + CenterCrop of each held-out photo on the
// device, the rows the JPEG engines took decoded a batch ahead, accuracy and mean loss.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "tandem/data/engine_split.h"
#include "tandem/detail/autocast.h"
#include "tandem/detail/lane.h"
#include "tandem/loader.h"
#include "tandem/models/folded_resnet.h"
#include "tandem/models/resnet.h"
#include "tandem/resized_crop.h"
#include "tandem/train/trainer.h"

namespace tandem::train::detail {

struct FolderEvaluationSetup {
  std::shared_ptr<models::ResNetImpl> model;
  /// The frozen backbone with its batch norm folded (evaluated as it trains), or null when the
  /// whole network trains.
  std::shared_ptr<models::FoldedResNet> folded;
  std::shared_ptr<const Dataset> data;  // center-crop regions, or whole images at Resize's scale
  ResizedCropSpec spec;                 // ResizedCropSpec::eval
  /// The evaluation's own split of the decodes (no decoder: the loader's workers alone).
  data::EngineSplit split;
  /// The share an evaluation turns the engines on at (adaptive shares), kept between
  /// evaluations; null: the split's share is left as it is.
  std::shared_ptr<double> engine_share;
  c10::Device device = c10::kCPU;
  Precision precision = Precision::kFp32;
  bool channels_last = false;
  int64_t batch_size = 1;
  int workers = 0;
  int worker_nice = 0;  ///< LoaderOptions::worker_nice of the evaluation's loader
  uint64_t seed = 0;
};

/// The job's evaluation (TrainJob::evaluate and ::prepare_evaluation).
struct FolderEvaluation {
  /// One pass over `setup.data` per call, on the calling lane, the model in eval mode
  /// meanwhile (train mode after, unless its backbone is frozen).
  std::function<Evaluation(const Lane& lane)> evaluate;
  /// On CUDA, the pass's kernels once: a stand-in image through the crop and a short batch of
  /// zeros, padded to the batch size, through the forward and the scoring, nothing kept; empty
  /// on the CPU (no kernels to load).
  std::function<void(const Lane& lane)> prepare;
};

FolderEvaluation folder_evaluation(FolderEvaluationSetup setup);

}  // namespace tandem::train::detail
