// ImageFolder: a folder with one subfolder of JPEG / PNG files per class, read as torchvision's
// datasets.ImageFolder reads it (same classes, same labels, same sample order), decoded and
// resized + center-cropped in the loader's worker threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/loader.h"

namespace tandem {
struct ResizedCropSpec;  // tandem/resized_crop.h
}

namespace tandem::data {

class EngineShare;  // engine_share.h

/// What an ImageFolder sample's image is.
enum class ImageFolderOutput {
  /// Resize(S) + CenterCrop(S) on the CPU, in the worker: (C, S, S), every sample alike.
  kCenterCrop,
  /// As decoded, at the sample's own size (a variable-size field), (H, W, C) interleaved: the JPEG
  /// at the smallest DCT
  /// scale whose height and width are still >= S (a 640 x 480 photo for S = 224 decodes at
  /// 320 x 240, for a quarter of the work), a PNG at full size. The GPU crops and resizes the
  /// batch (resized_crop.h: RandomResizedCrop for training, Resize + CenterCrop for evaluation).
  kDecoded,
  /// The JPEG file's bytes, undecoded (a variable-size field "jpeg" that stays on the host: the
  /// GPU decodes it, NvjpegDecoder). The worker reads the header first, so a file that is not a
  /// JPEG, or a CMYK one nvJPEG cannot decode, stops (or, with skip_bad, is skipped) naming it.
  kEncoded,
  /// Training's crop chosen before decoding: each sample draws torchvision's RandomResizedCrop
  /// box and flip (ResizedCropSpec::train(S), the loader's per-sample key: SampleDraw) in the
  /// image's full-resolution pixels from its header, then decodes only that box, at the smallest
  /// DCT scale at which the box keeps S a side (decode_image_region): (h, w, C) interleaved, a
  /// variable-size field, typically between S and 2S a side, plus the box in those pixels
  /// ("crop_box", kCropBoxFields int32, sub-pixel in eighths) for given_crop_feed. No crop is
  /// enlarged where torchvision's crop of the full image would be shrunk, and a small box of a
  /// large photo costs a fraction of a whole-image decode.
  kCropRegion,
  /// Evaluation's crop chosen before decoding: torchvision's Resize(resize_size) +
  /// CenterCrop(S) box, placed in the image's full-resolution pixels from its header, with two
  /// resized pixels of margin on each side (so the resample's taps reach as far as they would
  /// in the whole resized image), then only that region decoded at the smallest DCT scale at
  /// which it keeps its resized size (decode_center_crop). The fields of kCropRegion; the box
  /// keeps Resize's scale, so the crop is torchvision's within the decode's rounding, and the
  /// pixels outside the center crop (a quarter to a half of a photo) are never decoded.
  kCenterRegion,
};

struct ImageFolderOptions {
  int64_t image_size = 224;  ///< S: the size the model sees (see ImageFolderOutput)
  int64_t channels = 3;      ///< 3 (RGB) or 1 (gray)
  ImageFolderOutput output = ImageFolderOutput::kCenterCrop;
  /// kCropRegion, kCenterRegion and kDecoded: the share of samples, in [0, 1], left to the GPU's
  /// JPEG engines — those whose draw positions decodes_on_engines() picks (kCropRegion: the same
  /// count per block of positions, the costliest for the CPU, engines_take_costliest with
  /// crop_region_cpu_cost) carry the file's bytes ("jpeg") and their box in the full-resolution
  /// pixels instead of a decoded region, so the CPU workers and the engines decode side by side. A
  /// sample the engines cannot read (a PNG, a CMYK JPEG) is decoded on the CPU wherever its
  /// position falls. 0: every sample on the CPU. (A share that moves during the run:
  /// with_engine_share(EngineShare).)
  double engine_share = 0;
  /// kCenterRegion only: Resize's shorter side (S * 256 / 224 where 0, ImageNet's ratio).
  int64_t resize_size = 0;
};

/// Whether the sample at draw position `position` goes to the JPEG engines for `share`:
/// round(share * 1024) of every 1024 consecutive positions, spread evenly (a pure function of
/// the position, so every mode and a resumed run split alike).
bool decodes_on_engines(double share, uint64_t position);

/// What a kCropRegion sample drawn from `draw` costs a CPU worker, as a key that orders the
/// positions (EngineShare ranks a block of them by it): how far down the image its box reaches,
/// 0..1. A region decode reads every row above the box's bottom and none below, and
/// Huffman-decoding those rows is most of its time. The box is `spec`'s drawn for a square
/// reference image, since ranking a block needs its other positions' keys before their files are
/// read; the sample's own box, drawn for its own size, follows it closely.
double crop_region_cpu_cost(const ResizedCropSpec& spec, const SampleDraw& draw);

/// A kCropRegion sample's image: the RandomResizedCrop box and flip of
/// ResizedCropSpec::train(size) drawn from `draw` for the image in `bytes` (its header's size),
/// only that box decoded (decode_image_region, at the scale that keeps it at `size`). `box`
/// receives the kCropBoxFields values, placed in the returned (h, w, channels) pixels.
at::Tensor decode_drawn_crop(const std::vector<uint8_t>& bytes, const std::string& path,
                             int64_t channels, int64_t size, const SampleDraw& draw, int32_t* box);

/// A kCenterRegion sample's image: the center crop of ResizedCropSpec::eval(size, resize_size)
/// for the image in `bytes` (its header's size), with a margin of two resized pixels a side
/// where the resized image has them, decoded as a region (decode_image_region, at the scale
/// that keeps the margined crop at its resized size). `box` receives the kCropBoxFields values
/// placed in the returned (h, w, channels) pixels: the margined crop, resized to the crop's
/// size plus the margins, the output starting after the margin.
at::Tensor decode_center_crop(const std::vector<uint8_t>& bytes, const std::string& path,
                              int64_t channels, int64_t size, int64_t resize_size, int32_t* box);

/// Fields: {"image", {C, S, S}, kByte} (kDecoded and the regions: (H, W, C), variable-size,
/// typical 1.5 S a side; kEncoded: "jpeg" instead, the file's bytes), for kCropRegion with an
/// engine_share also "jpeg" (the bytes of the engines' samples, empty for the others, whose
/// "image" is then (0, 0, C)), for the regions {"crop_box", {kCropBoxFields}, kInt}, then
/// {"label", {}, kLong}.
///
/// The index, built once by the constructor: classes are the subfolders of `root` (symlinks
/// followed), sorted by name in byte order, label = position; each class folder is walked
/// recursively, folders in order of their path, files sorted by name within a folder —
/// torchvision's make_dataset order, so samples()[i] is torchvision's samples[i]. Symlinked
/// folders are followed, but every folder is read once: a link back to the root, a class folder
/// or a folder above it (a loop), or a second link to a folder already read, is skipped with one
/// warning naming it (warnings(), also printed to stderr), so no file counts twice or under
/// another class. (Two class folders that are one folder are the exception: each class gets its
/// files, as in torchvision, with a warning.) Files whose extension is .jpg, .jpeg or .png in
/// any letter case are samples; others are ignored (the content is sniffed at decode, so a PNG
/// named .jpg still loads). The walk stat()s entries and never opens one: a named pipe, socket
/// or device named like an image is a sample that fails to load, naming its path and kind
/// ("not a regular file: a named pipe"), and is skipped as any bad file under skip_bad.
///
/// get() (any thread): read, decode at the smallest DCT scale that covers the resize target,
/// resize (bilinear, antialias), center crop, copy into the slot.
class ImageFolderDataset : public Dataset {
 public:
  struct Sample {
    std::string path;
    int64_t label = 0;
  };

  /// Throws InvalidArgument naming the path when `root` does not exist or is not a folder, has
  /// no class folder, or some class folders hold no image ("found no valid file for the classes
  /// a, b", like torchvision), or when the options are out of range (size >= 1, channels 1 or
  /// 3); tandem::Error when a folder cannot be listed.
  explicit ImageFolderDataset(std::string root, ImageFolderOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  std::vector<FieldSpec> fields() const override;
  /// Throws tandem::Error naming the file when it cannot be read or decoded (the loader adds
  /// the sample index), InvalidArgument for an index out of range.
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override;
  /// kCropRegion: the box drawn from `draw`; kCenterRegion: the center crop (drawn from nothing,
  /// split by the draw's position); other outputs draw nothing (get_sample()).
  void get_drawn_sample(int64_t index, const SampleDraw& draw,
                        std::vector<at::Tensor>& out) const override;
  /// The same for kCenterCrop (fixed-size samples into `out`'s views); kDecoded samples have no
  /// fixed size: InvalidArgument, use get_sample().
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;
  /// The sample's path ("" for an index out of range).
  std::string sample_source(int64_t index) const override;

  const std::string& root() const { return root_; }
  const ImageFolderOptions& options() const { return options_; }
  /// Class names; label i is classes()[i].
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<Sample>& samples() const { return samples_; }
  /// What the walk skipped and why, one line each (symlink loops, second links to a folder).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// `n` samples (all, if fewer) spread evenly over the index — every class represented — for
  /// trials and benchmarks: samples()[i * size() / n].
  std::vector<Sample> spread_samples(int64_t n) const;
  /// The same index with another output (no second walk of the folder).
  ImageFolderDataset with_output(ImageFolderOutput output) const;
  /// The same index with another image_size (an evaluation's, which decodes for Resize's
  /// shorter side rather than the crop). InvalidArgument unless size >= 1.
  ImageFolderDataset with_image_size(int64_t size) const;
  /// The same index with another ImageFolderOptions::resize_size (kCenterRegion's Resize).
  /// InvalidArgument unless 0 or >= the image size.
  ImageFolderDataset with_resize_size(int64_t size) const;
  /// The same index with another ImageFolderOptions::engine_share (InvalidArgument outside
  /// [0, 1], or above 0 for an output other than kCropRegion, kCenterRegion or kDecoded).
  ImageFolderDataset with_engine_share(double share) const;
  /// The same index split by `share` (shared with whoever moves it: an adaptive EngineShare
  /// and its feed stage); null: no split. InvalidArgument for an output that does not split.
  ImageFolderDataset with_engine_share(std::shared_ptr<EngineShare> share) const;
  /// The split's share (null without one).
  const std::shared_ptr<EngineShare>& engine_share() const { return engine_share_; }
  /// kCenterRegion's Resize shorter side: options().resize_size, or S * 256 / 224 where 0.
  int64_t resize_size() const {
    return options_.resize_size > 0 ? options_.resize_size : options_.image_size * 256 / 224;
  }

 private:
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<Sample> samples_;
  std::vector<std::string> warnings_;
  std::shared_ptr<EngineShare> engine_share_;  // the workers' and engines' split; null: none
};

}  // namespace tandem::data
