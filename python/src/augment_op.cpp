// torch.ops.tandem.augment: tandem's fused augmentation (crop, resize, rotate, blur, normalize,
// flip; per-sample parameters drawn on the batch's device) as a PyTorch operator, so Python
// code calls it like any torch op and torch.compile traces through it (the Meta kernel gives
// the output's shape without running it). CPU: the C++ reference; CUDA: the fused kernel on the
// current stream, parameters drawn by one kernel from the generator (capturable).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "augment_spec.h"
#include "tandem/augment.h"

tandem::AugmentSpec augment_spec_from(at::IntArrayRef crop, at::IntArrayRef out,
                                      double max_rotation_deg, int64_t blur_kernel,
                                      double sigma_min, double sigma_max, at::ArrayRef<double> mean,
                                      at::ArrayRef<double> std, double hflip_probability) {
  TORCH_CHECK(crop.size() == 2 && out.size() == 2,
              "tandem.augment: crop and out are (h, w) "
              "pairs; got ",
              crop.size(), " and ", out.size(), " values");
  tandem::AugmentSpec s;
  s.crop_h = crop[0];
  s.crop_w = crop[1];
  s.out_h = out[0];
  s.out_w = out[1];
  s.max_rotation_deg = max_rotation_deg;
  s.blur_kernel = blur_kernel;
  s.sigma_min = sigma_min;
  s.sigma_max = sigma_max;
  s.mean.assign(mean.begin(), mean.end());
  s.std.assign(std.begin(), std.end());
  s.hflip_probability = hflip_probability;
  return s;
}

namespace {

void check_images(const at::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.scalar_type() == at::kByte,
              "tandem.augment: expected a (B, C, H, W) uint8 batch; got a ", images.scalar_type(),
              " tensor of shape ", images.sizes());
}

at::Tensor augment_op(const at::Tensor& images, at::IntArrayRef crop, at::IntArrayRef out,
                      double max_rotation_deg, int64_t blur_kernel, double sigma_min,
                      double sigma_max, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                      double hflip_probability, std::optional<at::Generator> generator) {
  check_images(images);
  const tandem::AugmentSpec spec = augment_spec_from(
      crop, out, max_rotation_deg, blur_kernel, sigma_min, sigma_max, mean, std, hflip_probability);
  spec.validate(images.size(1), images.size(2), images.size(3));
  const tandem::AugmentParams p =
      tandem::draw_augment_params(spec, images.size(0), images.size(2), images.size(3),
                                  images.device(), generator.value_or(at::Generator()));
  return tandem::augment(images.contiguous(), p, spec);
}

// Shapes only: what FakeTensor (torch.compile, torch.export) sees of the op.
at::Tensor augment_meta(const at::Tensor& images, at::IntArrayRef crop, at::IntArrayRef out, double,
                        int64_t, double, double, at::ArrayRef<double>, at::ArrayRef<double>, double,
                        std::optional<at::Generator>) {
  check_images(images);
  TORCH_CHECK(out.size() == 2, "tandem.augment: out is an (h, w) pair");
  return at::empty({images.size(0), images.size(1), out[0], out[1]},
                   images.options().dtype(at::kFloat));
}

}  // namespace

TORCH_LIBRARY(tandem, m) {
  m.def(
      "augment(Tensor images, int[] crop, int[] out, float max_rotation_deg, int blur_kernel, "
      "float sigma_min, float sigma_max, float[] mean, float[] std, float hflip_probability, "
      "Generator? generator=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(tandem, CPU, m) { m.impl("augment", &augment_op); }
TORCH_LIBRARY_IMPL(tandem, CUDA, m) { m.impl("augment", &augment_op); }
TORCH_LIBRARY_IMPL(tandem, Meta, m) { m.impl("augment", &augment_meta); }
