// The CPU workers and the GPU's JPEG engines decoding one run's samples together: which samples
// go to the engines (EngineShare, by draw position), the short trial that rates both sides
// before a run (DecodeTrial, open_engine_split), and the two feed stages that decode the
// engines' rows and put both sides into one batch (engine_split_feeds).
//
//   loader workers: positions the share leaves to the CPU ──► crop region decoded (TurboJPEG) ─┐
//                   the others ──► file bytes + box in full-resolution pixels ─┐               │
//   engines lane:   the engines decode their rows (nvJPEG, hardware) ◄────────┘               │
//                   ──► their crops ──┐                                                        │
//   augment lane:   the workers' regions resampled ◄──────────────────────────────────────────┘
//                   + the engines' crops ──► the batch
//
// An adaptive share follows the rates both sides measure as the run goes: the workers time each
// region they decode, the engines stage each batch's engine decode, and per window of batches the
// share moves toward where both sides would take the same time per batch
// (EngineShare::rebalance). Photos the CPU decodes fast stay on the workers (open_engine_split).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/engine_share.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/nvjpeg_decoder.h"
#include "tandem/resized_crop.h"
#include "tandem/workload.h"

namespace tandem::data {

/// Files read into memory for a decode trial: `n` spread over the folder (with jpeg_only, those
/// the JPEG engines read: no PNG, no CMYK).
struct DecodeTrial {
  std::vector<std::vector<uint8_t>> files;
  std::vector<EncodedImage> encoded;

  DecodeTrial(const ImageFolderDataset& folder, int64_t n, bool jpeg_only);
  /// The rate of decode_one(i) (thread-safe) on `cores` threads at once, each decoding
  /// kTrialDecodesPerCore files (fewer where there are fewer) from its own start in the list:
  /// the cores' contention is in it, as it is in a loader's. (One core's rate times `cores`
  /// over-stated the workers' rate in a run by ~1.3x on the H200 machine's 16 cores: 4,773
  /// against 3,423-3,569 crop regions a second of 1000-2000 px photos.) Rethrows a decode's
  /// exception. `seconds_per_file`, where given, receives each file's mean decode time (0 for
  /// one no core reached).
  double cpu_rate(int cores, const std::function<void(size_t)>& decode_one,
                  std::vector<double>* seconds_per_file = nullptr) const;
  static constexpr size_t kTrialDecodesPerCore = 16;
  /// nvJPEG's rate on the files as one batch, after a warm-up batch; throws what decode()
  /// throws.
  double engine_rate(NvjpegDecoder& decoder, c10::Device device) const;
  /// The cores a loader can decode on here: all but one (the pipeline's threads).
  static int cores();
};

/// The JPEG engines' side of a split run: their decoder (one, used by the feed stage's thread
/// alone) and the share.
struct EngineSplit {
  std::shared_ptr<NvjpegDecoder> decoder;
  std::shared_ptr<EngineShare> share;
  int workers = 1;  ///< the loader's workers, for the CPU side's combined rate
};

/// A split for `folder` (kCropRegion at crop size `size`) on `device`, or one without a decoder
/// where there is none: not a GPU, no JPEG engines (said on stderr), a share of 0, a trial
/// batch the engines fail. `given` >= 0 is a fixed share; otherwise a short trial on the
/// folder's files, their regions decoded on DecodeTrial::cores() threads at once: above 600
/// regions a second per core the workers feed the step alone (no split: the engines' host work
/// on the feed stage's thread costs more than it brings there); else the engines on a batch
/// too, and the share starts at the engines' rate over the sum, adaptive
/// (EngineShare::rebalance). The choice is said on stderr, prefixed `who`.
EngineSplit open_engine_split(const ImageFolderDataset& folder, c10::Device device, int64_t size,
                              double given, int workers, const std::string& who);

/// A split batch's rows: those a worker decoded (an empty "jpeg") and those left to the
/// engines, with their bytes (pointers into the batch's host "jpeg" field, which must outlive
/// `encoded`). `jpeg`, `offsets`, `sizes`: the field and its offsets and sizes, on the host.
struct SplitRows {
  std::vector<int64_t> cpu, engines;
  std::vector<EncodedImage> encoded;
};
SplitRows split_rows(const at::Tensor& jpeg, const at::Tensor& offsets, const at::Tensor& sizes);
/// The rows of each side only (no `encoded`), from the "jpeg" field's sizes on the host.
SplitRows split_sides(const at::Tensor& sizes);

/// A split for another loader of the same run (an evaluation's, of kDecoded samples): a decoder
/// of its own (for the one thread that crops that loader's batches) and a share starting at
/// `split`'s, adaptive if that one is. No decoder where `split` has none or the engines do not
/// open again.
EngineSplit companion_split(const EngineSplit& split, c10::Device device, int workers);

/// The rows a split loader left to the engines, cropped: decodes `encoded` on split.decoder
/// (on `device`'s current stream) and resamples `boxes` ((N, kCropBoxFields) on the device, in
/// the full-resolution pixels: the loader's draws) of them — where `boxes` is undefined, `spec`'s
/// boxes drawn on the device for the decoded sizes (evaluation's Resize + CenterCrop draws
/// nothing random): (N, C, out_h, out_w) normalized. Records the engines' time in split.share
/// and rebalances an adaptive one for batches of `batch_size`. `bytes`: the host tensor the
/// encoded images point into, if any (decode_on_device).
at::Tensor engine_crops(const ResizedCropSpec& spec, const EngineSplit& split,
                        const std::vector<EncodedImage>& encoded, c10::Device device,
                        int64_t batch_size, const at::Tensor& boxes = {},
                        const at::Tensor& bytes = {});

/// The batch field the engines' stage writes: the crops of the rows it decoded, in row order,
/// (E, C, out_h, out_w) float (E = 0 where the workers decoded the whole batch).
inline constexpr const char* kEngineCropsField = "engine_crops";

/// The feed stages of a split run, in order:
/// - "engines" (a lane and, pipelined, a thread of its own): inputs jpeg (+ offsets, sizes) and
///   crop_box from the loader; the rows whose "jpeg" is not empty are decoded on the engines at
///   full size and resampled by their boxes (full-resolution pixels) into kEngineCropsField.
///   Records the engines' times in split.share and rebalances an adaptive share
///   (EngineShare::rebalance); its report (for the run's notes) is EngineShare::report.
/// - "augment": split_crops_feed.
/// Two stages, so that in the pipelined modes the engines decode one batch while the augment
/// stage resamples the one before and the loader hands over the next: nvJPEG holds its caller
/// in a host ring of event waits for most of a batch's decode, which on the augment stage's
/// thread came on top of the stage's other work. Both Capture::kNever (nvJPEG's host work,
/// sizes that vary).
std::vector<FeedStage> engine_split_feeds(const ResizedCropSpec& spec, EngineSplit split,
                                          c10::Device device, bool channels_last,
                                          int64_t batch_size);

/// The augment stage of a split run: inputs image (+ offsets, sizes), the "jpeg" field's sizes
/// (on the host), crop_box and kEngineCropsField; output "x" (B, C, out_h, out_w) normalized,
/// channels last with `channels_last`. The rows a worker decoded (an empty "jpeg": its region,
/// the box placed in it) are resampled here, the engines' crops put in their rows.
FeedStage split_crops_feed(const ResizedCropSpec& spec, bool channels_last);

/// Decodes `encoded` on `decoder` (on `device`'s current stream), returning the packed planar
/// images and their sizes as (B, 3) (H, W, C) int64 on the device, as resized_crop reads them.
/// Where `bytes`, the host tensor the images point into, is pinned (a loader batch's field on a
/// GPU run), the engines read it in place (HostBytes::kPinnedUntilStreamDone): LibTorch's
/// pinned host allocator is told the stream uses its block, so the block is not handed out
/// again before the decode's work is done. Otherwise the decoder copies the bytes first.
struct DeviceDecoded {
  PackedImages images;
  at::Tensor hwc_sizes;
};
DeviceDecoded decode_on_device(NvjpegDecoder& decoder, const std::vector<EncodedImage>& encoded,
                               c10::Device device, const at::Tensor& bytes = {});

/// `values` as an int64 tensor on `device`, copied without waiting for the stream's earlier work
/// (from pinned memory on a GPU): row indices and sizes a feed stage builds on the host.
at::Tensor host_to_device(const std::vector<int64_t>& values, c10::Device device);

}  // namespace tandem::data
