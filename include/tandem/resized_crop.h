// Crop and resize a batch of images of different sizes on the GPU, as torchvision's
// RandomResizedCrop + RandomHorizontalFlip (training) or Resize + CenterCrop (evaluation), then
// normalize: the step after decode, so the loader's workers only decode (loader.h packs their
// variable-size images; ImageFolderOutput::kDecoded). Boxes are drawn on the device, one kernel
// for the batch; the resample is another (antialiased bilinear, rounded to pixels as the uint8
// resize of torchvision rounds). A C++ twin computes the same values to the bit on the CPU.
//
//   at::Tensor boxes = draw_crop_boxes(spec, batch.get("image_sizes"), generator);
//   at::Tensor x = resized_crop(batch.get("image"), batch.get("image_offsets"),
//                               batch.get("image_sizes"), boxes, spec);   // (B, 3, 224, 224)
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/workload.h"

namespace tandem {

struct ResizedCropSpec {
  /// true: RandomResizedCrop(out, scale, ratio) — a random box of [scale_min, scale_max] of the
  /// image's area and width / height log-uniform in [ratio_min, ratio_max], resized to out.
  /// false: Resize(resize_size) (the shorter side) + CenterCrop(out).
  bool random = true;
  int64_t out_h = 224, out_w = 224;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  int64_t resize_size = 256;       ///< evaluation only
  double hflip_probability = 0.5;  ///< mirror the output with this probability
  /// Per channel, in pixel units 0..255: out = (pixel - mean) / std (ImageNet's by default:
  /// torchvision's 0.485 / 0.229 times 255).
  std::vector<double> mean{123.675, 116.28, 103.53};
  std::vector<double> std{58.395, 57.12, 57.375};
  /// Each packed sample is (C, H, W) planar (nvJPEG's output) instead of (H, W, C) interleaved
  /// (the CPU decoders'); sizes stay (H, W, C) either way.
  bool planar = false;
  /// The output laid out channels-last ((B, C, H, W) sizes, (B, H, W, C) in memory), written so
  /// by the kernel instead of copied after: what a channels-last model reads.
  bool channels_last = false;

  /// torchvision's ImageNet training transform at `size`: RandomResizedCrop + flip.
  static ResizedCropSpec train(int64_t size = 224);
  /// Its evaluation transform: Resize(resize) + CenterCrop(size), no flip.
  static ResizedCropSpec eval(int64_t size = 224, int64_t resize = 256);
  /// This spec with its output laid out channels-last or not (a feed's model's layout).
  ResizedCropSpec laid_out(bool channels_last_output) const {
    ResizedCropSpec s = *this;
    s.channels_last = channels_last_output;
    return s;
  }

  /// Throws InvalidArgument naming the first bad value for images of `channels` channels.
  void validate(int64_t channels) const;
};

/// Fields of a box row: crop top, left, height, width in the source; the size the crop is
/// resized to; where the output starts in the resized crop; flip (0 / 1); the box's sub-pixel
/// start and extra length per axis in eighths of a source pixel (rows, then columns: start +
/// 8 * length; 0 for whole pixels — a box cut from a DCT-scaled decode has eighths).
constexpr int64_t kCropBoxFields = 11;

/// Draws a box per sample for images of `sizes` ((B, 3) int64: H, W, C — a packed batch's sizes
/// field, loader.h) on their device: (B, kCropBoxFields) int32. On a GPU one kernel, keyed by
/// `generator`'s seed and next Philox offset (undefined: the device's default generator) —
/// reproducible for a seed, no host round trip, capturable; on the CPU the same function on the
/// host from the CPU generator.
at::Tensor draw_crop_boxes(const ResizedCropSpec& spec, const at::Tensor& sizes,
                           at::Generator generator = {});

/// Draws one sample's box on the host for an image of height x width, from `draw` (the loader's
/// per-sample key, loader.h): the distribution draw_crop_boxes draws from, for a dataset that
/// chooses the crop before decoding (ImageFolderOutput::kCropRegion). Writes kCropBoxFields
/// values to `box`, in the image's full-resolution pixels.
void draw_crop_box(const ResizedCropSpec& spec, int64_t height, int64_t width,
                   const SampleDraw& draw, int32_t* box);

/// Rewrites a box's place (top, left, height, width and their eighths, kSubY / kSubX) for the
/// same crop in a reduced decode of the image: the box at (top, left, height, width) in that
/// decode's pixels, fractional where the full-resolution edges fall inside one of its pixels
/// (data::DecodedRegion), rounded to eighths and kept within its region_h x region_w pixels.
/// The other fields (output size, offsets, flip) stay.
void place_crop_box(int32_t* box, double top, double left, double height, double width,
                    int64_t region_h, int64_t region_w);

/// Crops, resizes, flips and normalizes the packed batch (`packed` uint8 1-D holding each sample
/// as (H, W, C) interleaved — ImageFolderOutput::kDecoded's layout —, `offsets` (B,) and `sizes`
/// (B, 3) int64, loader.h's packing) by `boxes`: (B, C, out_h, out_w) float32 on the
/// inputs' device. One CUDA kernel on the current stream, or the C++ reference on the CPU (the
/// same values to the bit).
at::Tensor resized_crop(const at::Tensor& packed, const at::Tensor& offsets,
                        const at::Tensor& sizes, const at::Tensor& boxes,
                        const ResizedCropSpec& spec);

/// The feed stage (lane "augment", eager: its input sizes vary) that turns a loader's packed
/// batch of decoded images — the variable-size field `field` with its offsets and sizes — into
/// "x" (B, C, out, out) float: draw_crop_boxes from `generator` (registered with the stage),
/// then resized_crop; laid out channels-last when `channels_last`.
FeedStage resized_crop_feed(const ResizedCropSpec& spec, at::Generator generator,
                            bool channels_last = false, const std::string& field = "image");

/// The same stage for boxes the loader's workers chose (the fixed-size int32 field `boxes_field`,
/// (B, kCropBoxFields), which they decoded the crops for): resized_crop only, no draw.
FeedStage given_crop_feed(const ResizedCropSpec& spec, bool channels_last = false,
                          const std::string& field = "image",
                          const std::string& boxes_field = "crop_box");

}  // namespace tandem
