// Workload "images": an image classifier trained from a folder of JPEG / PNG files. The loader's
// workers read and decode (TurboJPEG, at the smallest DCT scale that still covers the crop), the
// GPU crops, resizes, flips and normalizes the packed batch (resized_crop.h), then a torchvision
// ResNet trains: a frozen ResNet-50 backbone on its own lane feeding a linear head
// (r50_frozen_head), or a whole ResNet-18 or ResNet-50 (r18_full, r50_full). torchvision's
// ImageFolder + DataLoader + RandomResizedCrop / flip / normalize loop, as tandem runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/detail/autocast.h"
#include "tandem/workload.h"

namespace tandem {

enum class ImagesModel { kR50FrozenHead, kR18Full, kR50Full };

struct ImagesOptions {
  ImagesModel model = ImagesModel::kR50FrozenHead;
  /// true: read the folder; false: one device-resident batch of already-cropped images (the
  /// same step without loading: the rate the loader has to keep up with).
  bool from_files = true;
  /// Files decoded on the CPU: each sample's random crop drawn in the loader's worker and only
  /// it decoded, at the scale it needs (ImageFolderOutput::kCropRegion); false: the whole image
  /// at the scale the model's size needs, the crop drawn on the device (kDecoded).
  bool crop_regions = true;
  /// decode=auto with crop regions on a GPU with JPEG engines: the engines' share of each
  /// batch, fixed (data::EngineShare), the CPU workers decoding the rest; < 0: a short trial
  /// sets the start (the engines' rate over the sum of both sides'), then the run's own rates
  /// move it (data::open_engine_split).
  double engine_share = -1;
  /// The loader's workers' nice value (DataSource::with_worker_nice): above 0 they give a core
  /// to the run's own host threads (the engines' feed stage, the step's launches) first.
  int worker_nice = 0;
  int64_t image_size = 224;
  double lr = 0.1, momentum = 0.9;
  /// bf16: the forward passes (backbone, model) under bf16 autocast, fp32 master weights.
  Precision precision = Precision::kFp32;
  bool channels_last = false;  ///< weights and inputs NHWC (models::to_channels_last)
  /// r50_frozen_head: the backbone as models::FoldedResNet (batch norm folded, cuDNN's fused
  /// conv + bias (+ add) + ReLU) instead of the module in eval mode.
  bool folded_backbone = true;
  /// r18_full, r50_full: batch norm fused with its ReLU and residual add in training on a GPU
  /// (models::ResNetOptions::fused_batch_norm).
  bool fused_batch_norm = true;
  /// r18_full, r50_full under bf16 with fused batch norm: the convolutions' weights cast a layer
  /// at a time (models::ResNetOptions::cast_weights_together).
  bool cast_weights_together = true;
  /// r18_full, r50_full under fp16 with the casts together: the batch norms' sums from the
  /// convolutions' epilogues (models::ResNetOptions::stats_in_convolutions).
  bool stats_in_convolutions = true;
  /// The trained ResNets' convolutions on kept plans (models::ResNetOptions::kept_conv_plans).
  bool kept_conv_plans = true;
  int64_t classes = 10;  ///< the head's outputs for resident data (a folder has its own)
};

/// The workload and what evaluating it needs.
struct ImagesWorkload {
  Workload workload;
  /// Class names (the folder's; "0".."9" for resident data), label i is classes[i].
  std::vector<std::string> classes;
  /// Logits of (B, 3, S, S) normalized images in evaluation mode (BatchNorm's running
  /// statistics), without autograd; the model goes back to training mode after.
  std::function<at::Tensor(const at::Tensor&)> logits;
};

/// Builds the workload over the ImageFolder at options.data (WorkloadOptions); params: model,
/// source, size, lr (see images_entry().params). Throws InvalidArgument naming the problem: no
/// --data, a folder that is not an ImageFolder, an unknown param value.
ImagesWorkload make_images(const WorkloadOptions& options);

/// The registry's entry (bs 256 on a GPU, 4 on the CPU).
WorkloadEntry images_entry();

}  // namespace tandem
