// Internals shared by the JPEG and PNG decoders: one-line errors naming the file, the BT.601
// luma every gray conversion uses, and the interleaved-to-planar copy both decoders end with.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/data/decode.h"
#include "tandem/error.h"

namespace tandem::data::detail {

/// Throws tandem::Error "<path>: <cause>".
[[noreturn]] inline void fail(const std::string& path, const std::string& cause) {
  throw Error(path + ": " + cause);
}

/// BT.601 luma in libjpeg's fixed point (jccolor.c: 0.29900, 0.58700, 0.11400 scaled by 2^16),
/// so a PNG converted to gray matches a JPEG decoded to TJPF_GRAY from the same RGB.
inline uint8_t luma601(uint32_t r, uint32_t g, uint32_t b) {
  return static_cast<uint8_t>((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}

/// (H, W, stored) interleaved 8-bit samples -> (channels, H, W) uint8 contiguous tensor.
/// stored: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA (alpha dropped); channels: 1 or 3.
at::Tensor interleaved_to_planar(const uint8_t* hwc, int64_t height, int64_t width, int stored,
                                 int64_t channels);

/// Throws unless height x width is a sane image size (1..kMaxImagePixels pixels).
void check_pixel_count(int64_t height, int64_t width, const std::string& path);

// PNG (png_codec.cpp).
ImageInfo read_png_info(const std::vector<uint8_t>& bytes, const std::string& path);
at::Tensor decode_png(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels);
at::Tensor decode_png_mask(const std::vector<uint8_t>& bytes, const std::string& path);

}  // namespace tandem::data::detail
