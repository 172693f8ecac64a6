// Photos made smaller once, before training: see shrink.h.
#include "tandem/data/shrink.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <utility>

#include "codec_util.h"
#include "jpeg_markers.h"
#include "tandem/data/resize.h"
#include "tandem/error.h"

namespace tandem::data {

namespace {
// RandomResizedCrop's narrowest aspect ratio (its default ratio=(3/4, 4/3)).
constexpr double kLeastRatio = 3.0 / 4.0;
}  // namespace

KeptSize kept_size(int64_t image_size, double min_scale) {
  TANDEM_CHECK_ARG(image_size >= 1, "shrink: image size ", image_size,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(min_scale > 0 && min_scale <= 1, "shrink: crop scale ", min_scale,
                   " is not valid: expected a share of the area in (0, 1]");
  KeptSize k;
  const double side = static_cast<double>(image_size);
  k.min_area = static_cast<int64_t>(std::ceil(side * side / (min_scale * kLeastRatio)));
  k.min_short_side = (image_size * 256 + 223) / 224;  // 224 -> 256, rounded up
  return k;
}

std::array<int64_t, 2> shrunk_shape(int64_t height, int64_t width, const KeptSize& kept) {
  TANDEM_CHECK_ARG(height >= 1 && width >= 1, "shrink: image size ", height, " x ", width,
                   " is not valid");
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double by_area = std::sqrt(static_cast<double>(kept.min_area) / area);
  const double by_side =
      static_cast<double>(kept.min_short_side) / static_cast<double>(std::min(height, width));
  const double factor = std::max(by_area, by_side);
  if (factor >= 1) return {height, width};
  // Rounded up, so neither bound is missed by a rounding; never past the image's own size.
  const auto scaled = [&](int64_t v) {
    return std::min(v, static_cast<int64_t>(std::ceil(static_cast<double>(v) * factor - 1e-9)));
  };
  return {scaled(height), scaled(width)};
}

ShrunkImage shrink_image(const std::vector<uint8_t>& bytes, const std::string& path,
                         const KeptSize& kept, int quality, ChromaSubsampling subsampling,
                         bool keep_metadata) {
  const ImageInfo info = read_image_info(bytes, path);  // names a bad file
  ShrunkImage out;
  out.height = out.out_height = info.height;
  out.width = out.out_width = info.width;
  const auto [h, w] = shrunk_shape(info.height, info.width, kept);
  const bool cmyk = info.format == ImageFormat::kJpeg && info.channels == 4;
  if (cmyk) {
    out.kept_because = "a CMYK JPEG";
  } else if (h == info.height && w == info.width) {
    out.kept_because = "small enough";
  } else {
    // What training decodes (8-bit gray or RGB: a PNG's alpha and 16-bit depth dropped, a palette
    // expanded), a JPEG at the smallest DCT scale that still covers (h, w) (a PNG whole), then
    // one antialiased resize to it; a PNG written again losslessly.
    const int64_t channels = info.channels <= 2 ? 1 : 3;
    const at::Tensor resized = resize_bilinear(decode_image(bytes, path, channels, h, w), h, w);
    std::vector<uint8_t> encoded;
    if (info.format == ImageFormat::kPng) {
      encoded = encode_png(resized);
    } else {
      encoded = encode_jpeg(resized, quality, subsampling);
      if (keep_metadata) encoded = detail::with_metadata_of(bytes, encoded);
    }
    // A file written at a lower JPEG quality than `quality`, or a PNG compressed harder, can
    // come out larger: kept, since its bytes are most of a decode's time.
    if (encoded.size() < bytes.size()) {
      out.bytes = std::move(encoded);
      out.shrunk = true;
      out.out_height = h;
      out.out_width = w;
      return out;
    }
    out.kept_because = "smaller as it is";
  }
  // Copied without a decode: a JPEG cut short is still named here, not when training meets it.
  if (info.format == ImageFormat::kJpeg && !detail::jpeg_is_complete(bytes.data(), bytes.size()))
    detail::fail(path, "corrupt or truncated JPEG (no end-of-image marker after the image data)");
  if (info.progressive) {  // the same coefficients in sequential scans: a quarter of the decode
    out.bytes = baseline_jpeg(bytes, path);
    out.made_baseline = true;
    out.kept_because.clear();
    return out;
  }
  out.bytes = bytes;
  return out;
}

std::string damaged_output(const std::string& path) {
  // The PNG's closing chunk: length 0, "IEND", its CRC.
  static constexpr uint8_t kIend[] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  try {
    const std::vector<uint8_t> bytes = read_file(path);
    const ImageInfo info = read_image_info(bytes, path);
    if (info.format == ImageFormat::kJpeg && !detail::jpeg_is_complete(bytes.data(), bytes.size()))
      return "a JPEG cut short (no end-of-image marker after its data)";
    // Anywhere: a PNG copied as it was may carry bytes after its IEND, and stays whole.
    if (info.format == ImageFormat::kPng &&
        std::search(bytes.begin(), bytes.end(), std::begin(kIend), std::end(kIend)) == bytes.end())
      return "a PNG cut short (no IEND chunk)";
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

PhotoSizes survey_photo_sizes(const Dataset& dataset, const KeptSize& kept, int64_t count) {
  constexpr size_t kHeaderBytes = 256 * 1024;  // EXIF (with its thumbnail) fits in 64 KiB
  std::vector<double> areas;
  int64_t progressive = 0;
  const int64_t n = dataset.size(), take = std::min(n, count);
  for (int64_t k = 0; k < take; ++k) {
    const std::string path = dataset.sample_source(k * n / take);
    if (path.empty()) continue;
    try {
      // read_file: a FIFO or a device among the photos is named, never opened (an open would
      // wait for a writer), and is the run's to report.
      const std::vector<uint8_t> head = read_file(path, kHeaderBytes);
      if (head.empty()) continue;
      const ImageInfo info = read_image_info(head, path);
      areas.push_back(static_cast<double>(info.height) * static_cast<double>(info.width));
      if (info.progressive) ++progressive;
    } catch (const std::exception&) {  // not this survey's to report: the run names bad files
    }
  }
  PhotoSizes p;
  p.sampled = static_cast<int64_t>(areas.size());
  p.progressive = progressive;
  if (areas.empty()) return p;
  std::nth_element(areas.begin(), areas.begin() + static_cast<long>(areas.size() / 2), areas.end());
  p.median_pixels = areas[areas.size() / 2];
  p.over_kept = p.median_pixels / static_cast<double>(kept.min_area);
  return p;
}

std::string shrink_hint(const PhotoSizes& sizes, const KeptSize& kept, int64_t image_size,
                        const std::string& data, double factor) {
  const bool large = sizes.sampled > 0 && sizes.over_kept >= factor;
  // One in eight: a share whose decode (about four baseline ones each) costs the CPU half again.
  const bool progressive = sizes.sampled > 0 && sizes.progressive * 8 >= sizes.sampled;
  if (!large && !progressive) return "";
  const std::string command =
      "`tandem shrink --data " + data + " --out " + data + "-shrunk` writes them ";
  char line[768];
  if (large) {
    std::snprintf(line, sizeof(line),
                  "photos of about %.1f megapixels (the median of %lld), %.1f x what %lld px crops "
                  "need: %sat %.2f megapixels (the same crops), each decoded in a fraction of the "
                  "time",
                  sizes.median_pixels / 1e6, static_cast<long long>(sizes.sampled), sizes.over_kept,
                  static_cast<long long>(image_size), command.c_str(),
                  static_cast<double>(kept.min_area) / 1e6);
    std::string text = line;
    if (progressive)
      text += tandem::detail::concat(", and as baseline JPEGs: ", sizes.progressive, " of the ",
                                     sizes.sampled,
                                     " are progressive (decoded whole for any crop, and never "
                                     "by the JPEG engines)");
    return text;
  }
  std::snprintf(line, sizeof(line),
                "%lld of %lld photos sampled are progressive JPEGs, decoded whole for any crop "
                "(about 4 x a baseline crop's time on the CPU) and never by the JPEG engines: "
                "%sas baseline without a loss (the same pixels)",
                static_cast<long long>(sizes.progressive), static_cast<long long>(sizes.sampled),
                command.c_str());
  return line;
}

}  // namespace tandem::data
