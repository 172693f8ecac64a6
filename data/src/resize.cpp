// Resize + center crop on the CPU, with torchvision's arithmetic (see resize.h).
#include "tandem/data/resize.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <vector>

#include "tandem/error.h"

namespace tandem::data {
namespace {

void check_image(const at::Tensor& t, const char* what) {
  TANDEM_CHECK_ARG(
      t.defined() && t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 3 &&
          t.size(0) >= 1 && t.size(1) >= 1 && t.size(2) >= 1,
      what, ": expected a non-empty (C, H, W) uint8 CPU tensor, got ",
      t.defined() ? c10::str(t.scalar_type(), " of shape ", t.sizes()) : std::string("undefined"));
}

// PyTorch's nearest_idx (aten/src/ATen/native/UpSample.h) for interpolate(size=...), which
// passes no scale factor: exact copy at 1x, a shift at 2x, else floor(dst * (float)in / out)
// in single precision.
at::Tensor nearest_indices(int64_t input_size, int64_t output_size) {
  at::Tensor index = at::empty({output_size}, at::kLong);
  int64_t* p = index.data_ptr<int64_t>();
  const float scale = static_cast<float>(input_size) / static_cast<float>(output_size);
  for (int64_t i = 0; i < output_size; ++i) {
    if (output_size == input_size)
      p[i] = i;
    else if (output_size == 2 * input_size)
      p[i] = i >> 1;
    else
      p[i] =
          std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), input_size - 1);
  }
  return index;
}

}  // namespace

std::array<int64_t, 2> resized_shape(int64_t height, int64_t width, int64_t size) {
  TANDEM_CHECK_ARG(height >= 1 && width >= 1 && size >= 1, "resized_shape: need height, width ",
                   "and size >= 1, got ", height, ", ", width, ", ", size);
  // torchvision: new_long = int(requested_new_short * long / short), in double precision.
  const int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto new_long = static_cast<int64_t>(
      static_cast<double>(size) * static_cast<double>(longer) / static_cast<double>(shorter));
  if (width <= height) return {new_long, size};
  return {size, new_long};
}

at::Tensor resize_bilinear(const at::Tensor& chw_u8, int64_t out_height, int64_t out_width) {
  check_image(chw_u8, "resize_bilinear");
  TANDEM_CHECK_ARG(out_height >= 1 && out_width >= 1, "resize_bilinear: output size must be ",
                   ">= 1, got ", out_height, " x ", out_width);
  if (chw_u8.size(1) == out_height && chw_u8.size(2) == out_width) return chw_u8.contiguous();
  // uint8 in, uint8 out: ATen's fixed-point kernel (AVX2 where the CPU has it), 2-4x faster than
  // the float kernel plus conversions, and what torchvision itself runs for uint8 CPU tensors on
  // AVX2 machines; within 1 of the float path everywhere.
  return at::_upsample_bilinear2d_aa(chw_u8.contiguous().unsqueeze(0), {out_height, out_width},
                                     /*align_corners=*/false)
      .squeeze(0)
      .contiguous();
}

at::Tensor resize_nearest(const at::Tensor& t, int64_t out_height, int64_t out_width) {
  TANDEM_CHECK_ARG(t.defined() && t.device().is_cpu() && (t.dim() == 2 || t.dim() == 3) &&
                       t.size(-1) >= 1 && t.size(-2) >= 1,
                   "resize_nearest: expected a non-empty (H, W) or (C, H, W) CPU tensor, got ",
                   t.defined() ? c10::str(t.sizes()) : std::string("undefined"));
  TANDEM_CHECK_ARG(out_height >= 1 && out_width >= 1, "resize_nearest: output size must be ",
                   ">= 1, got ", out_height, " x ", out_width);
  const int64_t h = t.size(-2), w = t.size(-1);
  at::Tensor out = t;
  if (h != out_height) out = out.index_select(t.dim() - 2, nearest_indices(h, out_height));
  if (w != out_width) out = out.index_select(t.dim() - 1, nearest_indices(w, out_width));
  return out.contiguous();
}

at::Tensor center_crop(const at::Tensor& t, int64_t size) {
  TANDEM_CHECK_ARG(
      t.defined() && t.dim() >= 2 && size >= 1 && t.size(-2) >= size && t.size(-1) >= size,
      "center_crop: cannot take ", size, " x ", size, " from ",
      t.defined() ? c10::str(t.sizes()) : std::string("undefined"));
  // Python's round() is half to even, as is nearbyint in the default rounding mode.
  const auto offset = [](int64_t excess) {
    return static_cast<int64_t>(std::nearbyint(static_cast<double>(excess) / 2.0));
  };
  const int64_t top = offset(t.size(-2) - size), left = offset(t.size(-1) - size);
  return t.narrow(-2, top, size).narrow(-1, left, size);
}

at::Tensor resize_center_crop(const at::Tensor& chw_u8, int64_t size) {
  check_image(chw_u8, "resize_center_crop");
  TANDEM_CHECK_ARG(size >= 1, "resize_center_crop: size must be >= 1, got ", size);
  const auto shape = resized_shape(chw_u8.size(1), chw_u8.size(2), size);
  return center_crop(resize_bilinear(chw_u8, shape[0], shape[1]), size).contiguous();
}

}  // namespace tandem::data
