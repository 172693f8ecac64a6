// Photos made smaller once, before training, without changing what the model sees: each JPEG
// (or PNG) larger than training needs is decoded, resized and written again at the least size at
// which every RandomResizedCrop box still has the model's pixels and the evaluation's Resize still
// shrinks. A phone's 12-megapixel photo then decodes in a tenth of the time, on the CPU workers
// and on the JPEG engines alike, and no crop is ever enlarged where torchvision's crop of the
// original would be shrunk. (FFCV's writer shrinks to a fixed side instead, which enlarges the
// small boxes.) `tandem shrink` runs it over a folder.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/data/decode.h"
#include "tandem/loader.h"  // Dataset

namespace tandem::data {

/// The sizes an image must keep for a model that sees `image_size` px squares:
/// RandomResizedCrop(image_size, scale=(min_scale, 1), ratio=(3/4, 4/3)) and the evaluation's
/// Resize(resize_size) + CenterCrop(image_size).
struct KeptSize {
  /// A box of scale s and aspect ratio r of an image of area A is sqrt(A s r) x sqrt(A s / r);
  /// its shorter side is least at s = min_scale and r at either end of (3/4, 4/3): sqrt(A
  /// min_scale 3/4). It is at least image_size for A >= image_size^2 / (min_scale 3/4):
  /// 836,267 px for 224 and 0.08.
  int64_t min_area = 0;
  /// The evaluation resizes the shorter side to this (image_size * 256 / 224, ImageNet's ratio).
  int64_t min_short_side = 0;
};

/// KeptSize for `image_size` (>= 1) and `min_scale` (in (0, 1]); InvalidArgument otherwise.
KeptSize kept_size(int64_t image_size, double min_scale = 0.08);

/// The (height, width) an image of (height, width) is shrunk to: scaled by one factor, the least
/// at which its area stays >= kept.min_area and its shorter side >= kept.min_short_side (sides
/// rounded up); the image's own size where that factor is not below 1.
std::array<int64_t, 2> shrunk_shape(int64_t height, int64_t width, const KeptSize& kept);

/// What shrink_image did with one file.
struct ShrunkImage {
  std::vector<uint8_t> bytes;  ///< what to write: the new JPEG, or the file's own bytes
  bool shrunk = false;         ///< false: `bytes` are the file's, unchanged or made_baseline
  /// A progressive JPEG not shrunk, written again as baseline without a loss (baseline_jpeg:
  /// the same pixels, every marker segment kept).
  bool made_baseline = false;
  /// Why neither: "small enough", "smaller as it is" (the new file had more bytes), "a CMYK
  /// JPEG".
  std::string kept_because;
  int64_t height = 0, width = 0;          ///< the file's
  int64_t out_height = 0, out_width = 0;  ///< what `bytes` hold
};

/// One file in memory: a JPEG larger than `kept` needs is decoded at the smallest DCT scale that
/// still covers shrunk_shape (decode_image with minimums), resized to it (resize_bilinear:
/// antialiased, as torchvision's Resize) and encoded as a baseline JPEG of `quality` and
/// `subsampling` (gray stays gray), unless that has as many bytes as the file. With
/// `keep_metadata`, the new JPEG carries the file's metadata segments as they are (EXIF with its
/// orientation and thumbnail, XMP, the ICC profile, IPTC, comments; not Adobe's APP14, which
/// describes the old coding): decoders that honour the orientation or the profile show the
/// shrunk photo as they showed the original (EXIF's recorded pixel size stays the original's).
/// A progressive JPEG it does not shrink (small enough, CMYK, or smaller as it is) is made
/// baseline without a loss (made_baseline): the same pixels, whose crops the CPU decodes in
/// about a quarter of the time and which the JPEG engines read (CMYK aside). A PNG larger than
/// `kept` needs is decoded as training decodes it (8-bit gray or RGB: transparency and 16-bit
/// depth dropped, a palette expanded), resized the same way and written as a PNG (lossless, no
/// metadata), unless that has as many bytes as the file: its decode time falls with its pixels.
/// Anything else keeps its bytes: an image small enough, a CMYK JPEG (which the JPEG engines do
/// not read either). Throws what read_image_info and decode_image throw for a bad file, naming
/// `path`, and names a JPEG cut short (no end-of-image marker after its data) where it would be
/// copied.
ShrunkImage shrink_image(const std::vector<uint8_t>& bytes, const std::string& path,
                         const KeptSize& kept, int quality = 95,
                         ChromaSubsampling subsampling = ChromaSubsampling::k420,
                         bool keep_metadata = true);

/// Why a file an earlier `tandem shrink` left at `path` is not whole (unreadable, not an image,
/// a JPEG without its end-of-image marker, a PNG without its IEND chunk), or "" when it
/// is: a rerun writes such a file again instead of keeping it.
std::string damaged_output(const std::string& path);

/// How large a dataset's photos are against `kept`, from the headers of up to `count` of its
/// files (Dataset::sample_source, samples spread over it; the first 256 KiB of each; a file
/// whose header lies further, or that fails, is left out): what `tandem train` and `data-bench`
/// read to say when `tandem shrink` would pay.
struct PhotoSizes {
  int64_t sampled = 0;       ///< headers read
  double median_pixels = 0;  ///< their median area
  double over_kept = 0;      ///< median_pixels / kept.min_area
  int64_t progressive = 0;   ///< of the headers read, progressive JPEGs
};
PhotoSizes survey_photo_sizes(const Dataset& dataset, const KeptSize& kept, int64_t count = 32);

/// "photos of about 12.2 megapixels (the median of 32), 14.6 x what 224 px crops need: `tandem
/// shrink --data D --out D-shrunk` writes them at 0.84 megapixels (the same crops), each decoded in
/// a fraction of the time" where the median is at least `factor` times kept.min_area (", and as
/// baseline JPEGs: N of the 32 are progressive ..." added where one in eight or more is); where
/// only that many are progressive, "N of 32 photos sampled are progressive JPEGs, ...: `tandem
/// shrink ...` writes them as baseline without a loss (the same pixels)"; "" otherwise.
std::string shrink_hint(const PhotoSizes& sizes, const KeptSize& kept, int64_t image_size,
                        const std::string& data, double factor = 2.0);

}  // namespace tandem::data
