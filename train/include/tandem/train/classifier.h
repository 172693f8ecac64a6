// Image classification and segmentation jobs for the Trainer, from a folder on disk:
// Fashion-MNIST-style IDX files with the small CNN, an ImageFolder with torchvision's ResNets
// (optionally a frozen backbone on its own lane and a trained head), or image + mask pairs with
// an FCN head over a ResNet (segmenter.cpp). What `tandem train` runs.
//
//   ClassifierOptions c;
//   c.data = "/usr/share/datasets/fashion-mnist";       // IDX: the small CNN, test set = t10k
//   TrainJob job = make_classifier(c);
//   Trainer(job, options).run();
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "tandem/detail/autocast.h"
#include "tandem/train/trainer.h"

namespace tandem::train {

using tandem::Precision;  // autocast.h: kFp32, kBf16

struct ClassifierOptions {
  /// An IDX folder (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], and for
  /// evaluation t10k-*), an ImageFolder (one subfolder of JPEG/PNG files per class), or a
  /// segmentation folder (images/ and masks/: PNG masks of class ids, matched by stem).
  std::string data;
  /// A held-out ImageFolder; empty: an IDX folder's t10k files, or val_split of the training
  /// folder, or no evaluation.
  std::string val;
  double val_split = 0;    ///< ImageFolder: this fraction of the samples (every k-th) held out
  int64_t subset = 0;      ///< train on this many samples spread over the set; 0: all
  int64_t val_subset = 0;  ///< evaluate on this many; 0: all
  /// small_cnn, resnet18, resnet34, resnet50, fcn_resnet18/34/50; "auto": small_cnn for IDX,
  /// fcn_resnet18 for image + mask pairs, resnet18 for an ImageFolder.
  std::string model = "auto";
  int64_t classes = 0;         ///< segmentation: the class count (required)
  int64_t ignore_index = 255;  ///< segmentation: the mask id no loss or metric counts
  std::string weights;  ///< safetensors to start from (torchvision's names); empty: random init
  bool freeze_backbone = false;     ///< ResNets: train fc only, the backbone frozen on its own lane
  std::string optimizer = "adamw";  ///< sgd | adamw
  double lr = -1;                   ///< < 0: 1e-3 for adamw, 0.1 for sgd
  double momentum = 0.9;            ///< sgd
  double weight_decay = -1;         ///< < 0: 1e-2 for adamw, 5e-4 for sgd
  Precision precision = Precision::kFp32;
  int64_t image_size = 224;  ///< ImageFolder: the crop the ResNet sees
  /// ImageFolder training: each sample's random crop drawn in the loader's worker and only that
  /// box decoded, at the scale that keeps it at image_size (ImageFolderOutput::kCropRegion:
  /// torchvision's crop of the full-resolution image, never an enlarged small one; more images
  /// per core than the whole-image decode through libjpeg's API, about half as many without
  /// it). false: the whole image at the scale image_size needs, the crop drawn on the device
  /// (kDecoded) from that reduced image. The evaluation follows: the center crop's region
  /// (kCenterRegion), or the whole image at Resize's scale.
  bool crop_regions = true;
  /// ImageFolder evaluation: the held-out samples, as the loader's workers decoded them at the
  /// first evaluation, kept in host memory up to this many bytes, so later evaluations of the
  /// run decode only what did not fit (their transform draws nothing: the same pixels every
  /// time). < 0: a quarter of this machine's memory, shared by its local ranks (a launch's
  /// LOCAL_WORLD_SIZE); 0: decode at every evaluation.
  int64_t eval_cache_bytes = -1;
  /// ImageFolder training with crop_regions on a GPU: "auto" splits each batch between the
  /// loader's workers and the GPU's JPEG engines (data/engine_split.h: a short trial sets the
  /// start, the run's own rates move it; CPU only where there are no engines), and the
  /// evaluation splits its decodes alike (a decoder and a share of its own); "cpu"
  /// decodes on the workers alone.
  std::string decode = "cpu";
  /// decode "auto": the engines' fixed share of each batch, 0 to 1 (a run that repeats its
  /// losses); < 0: measured, and following the rates.
  double engine_share = -1;
  /// ResNets: weights and inputs channels-last (models::to_channels_last): tensor-core
  /// convolutions without layout transposes. The saved weights are the same either way.
  bool channels_last = false;
  /// The run's (TrainOptions'): the evaluation's batches and loader, the engines' feed. The
  /// Trainer refuses a job built for another batch size or worker count than its options'.
  int64_t batch_size = kDefaultBatchSize;
  int workers = 0;  ///< 0: distributed::default_loader_workers for `device`, as TrainOptions' own
  /// The nice value of the training's and the evaluation's loader workers, 0 to kMaxNice
  /// (LoaderOptions::worker_nice): above 0 the run's own threads (the JPEG engines' feed, the
  /// step's launches) get a core first when the workers fill every core. 0: the process's.
  int worker_nice = 0;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 0;
};

/// Builds the job: datasets, model (weights loaded), optimizer, the step (augmentation and a
/// frozen backbone as feed stages, bf16 autocast inside the stages when asked) and the
/// evaluation (accuracy and mean loss). Throws InvalidArgument naming the bad option or input,
/// tandem::Error for unreadable data or weights.
TrainJob make_classifier(const ClassifierOptions& options);

/// Whether `dir` holds IDX training files (train-images-idx3-ubyte[.gz]).
bool is_idx_folder(const std::string& dir);
/// Whether `dir` has images/ and masks/ subfolders (a segmentation set).
bool is_pairs_folder(const std::string& dir);

/// The segmentation job make_classifier builds for a pairs folder: Resize + CenterCrop of
/// image and mask in the loader, normalization on the augment lane, an FCN over a ResNet,
/// cross-entropy over the pixels that are not ignore_index; evaluation: mIoU, pixel accuracy
/// and loss on --val / --val-split.
TrainJob make_segmenter(const ClassifierOptions& options);

}  // namespace tandem::train
