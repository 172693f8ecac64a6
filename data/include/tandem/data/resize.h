// CPU resize and center crop: torchvision's evaluation transform Resize(size) + CenterCrop(size)
// on tensors (bilinear with antialias for images, nearest for masks of class ids), used by the
// datasets after decode.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace tandem::data {

/// The (height, width) torchvision's Resize(size) gives an image of (height, width): the shorter
/// side becomes `size`, the longer one int(size * long / short) (truncated, as Python's int()).
/// Throws InvalidArgument unless all three are >= 1.
std::array<int64_t, 2> resized_shape(int64_t height, int64_t width, int64_t size);

/// Bilinear resize of a (C, H, W) uint8 CPU tensor to (C, out_height, out_width) with
/// antialiasing when shrinking (PIL's triangle filter; align_corners = false): what
/// torchvision's resize(antialias=True) computes. Runs ATen's uint8 kernel
/// (at::_upsample_bilinear2d_aa on uint8: fixed-point weights, AVX2 where present), as
/// torchvision does for uint8 CPU tensors on AVX2 machines; it is within 1 of torchvision's
/// float path (interpolate in float, clamp, round) and 2-4x faster.
at::Tensor resize_bilinear(const at::Tensor& chw_u8, int64_t out_height, int64_t out_width);

/// Nearest-neighbour resize of the last two dims of an (H, W) or (C, H, W) CPU tensor of any
/// dtype, with PyTorch's "nearest" rule (source index floor(dst * in / out), as
/// interpolate(mode="nearest") and torchvision's InterpolationMode.NEAREST): values are only
/// ever copied, so class ids stay class ids.
at::Tensor resize_nearest(const at::Tensor& t, int64_t out_height, int64_t out_width);

/// The central size x size window of the last two dims (a view), offsets rounded as
/// torchvision's CenterCrop: int(round((H - size) / 2)), Python's round half to even. Throws
/// InvalidArgument when the input is smaller than size.
at::Tensor center_crop(const at::Tensor& t, int64_t size);

/// Resize(size) + CenterCrop(size) of a (C, H, W) uint8 CPU tensor: (C, size, size) uint8,
/// contiguous. An image smaller than size is scaled up.
at::Tensor resize_center_crop(const at::Tensor& chw_u8, int64_t size);

}  // namespace tandem::data
