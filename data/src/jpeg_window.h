// A window of a JPEG decoded through libjpeg's own API (jpeglib.h): the rows above it skipped
// (entropy-decoded only: no IDCT, upsampling or color conversion), the columns beside it cropped
// (jpeg_crop_scanline), nothing below it read. TurboJPEG's API (turbojpeg.h, 2.1) has no
// partial decode: a window there costs a lossless transform — the whole file entropy-decoded
// and the window re-encoded — before the decode, about twice a whole-image scaled decode.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data::detail {

/// Whether this build has libjpeg's API (data/CMakeLists.txt: Debian libjpeg62-turbo-dev).
bool jpeg_window_available();

/// What decode_jpeg_window returns.
struct JpegWindow {
  /// (rows, cols, channels) uint8, interleaved: at least the requested window, from (top, left)
  /// of the scaled image (libjpeg widens the columns to its block grid).
  at::Tensor image;
  int64_t top = 0, left = 0;
  std::string error;    ///< libjpeg's message when it stopped (image undefined then)
  std::string warning;  ///< its first warning (corrupt data it decoded past), else empty
};

/// Rows [y0, y1) and columns [x0, x1) of the JPEG scaled by 1 / denom (1, 2, 4, 8), as gray
/// (channels 1) or RGB (3); `fast`: the ifast IDCT and replicated chroma (TurboJPEG's
/// TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE). Gray and YCbCr JPEGs only (not CMYK). Never throws
/// for bad bytes: the message is in `error`.
JpegWindow decode_jpeg_window(const std::vector<uint8_t>& bytes, int channels, int denom, bool fast,
                              int64_t y0, int64_t y1, int64_t x0, int64_t x1);

}  // namespace tandem::data::detail
