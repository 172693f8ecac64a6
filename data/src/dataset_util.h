// Internals shared by the folder datasets: which file names count as images, and the
// evaluation-time load of one image (decode at the smallest DCT scale that still covers the
// resize target, resize, center crop).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/data/decode.h"
#include "tandem/data/resize.h"

namespace tandem::data::detail {

/// The extension of `name` ("" if none), lower-cased: ".JPG" -> ".jpg".
inline std::string lower_extension(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  if (dot == std::string::npos) return "";
  std::string ext = name.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

/// .jpg, .jpeg or .png in any letter case.
inline bool has_image_extension(const std::string& name) {
  const std::string ext = lower_extension(name);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

/// An image file's extension tandem does not decode (WebP, BMP, TIFF, the Netpbm kinds, GIF,
/// HEIF/HEIC, AVIF): such files are left out of a folder, and the folder says how many.
/// Torchvision's ImageFolder reads the first five kinds through PIL.
inline bool is_unread_image_extension(const std::string& ext) {
  for (const char* e : {".webp", ".bmp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".gif", ".heic",
                        ".heif", ".avif"})
    if (ext == e) return true;
  return false;
}

/// Torchvision's Resize(size) + CenterCrop(size) of the image in `bytes`, decoded to `channels`.
/// The resize target comes from the header's size, not the decoded one, so the geometry is that
/// of the full-size image whatever DCT scale the decoder picks: (channels, size, size) uint8.
inline at::Tensor load_eval_image(const std::vector<uint8_t>& bytes, const std::string& path,
                                  int64_t channels, int64_t size, const ImageInfo& info) {
  const auto target = resized_shape(info.height, info.width, size);
  const at::Tensor decoded = decode_image(bytes, path, channels, target[0], target[1]);
  return center_crop(resize_bilinear(decoded, target[0], target[1]), size);
}

}  // namespace tandem::data::detail
