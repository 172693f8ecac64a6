// Resized crop: validation, the box draw (device and host), dispatch, and the C++ reference.
#include "tandem/resized_crop.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "check_normalization.h"
#include "draw_seeds.h"
#include "kernels/resized_crop_launch.h"
#include "tandem/error.h"

namespace tandem {

static_assert(kCropBoxFields == crop_math::kBoxFields, "resized_crop.h and crop_math agree");

ResizedCropSpec ResizedCropSpec::train(int64_t size) {
  ResizedCropSpec s;
  s.out_h = s.out_w = size;
  return s;
}

ResizedCropSpec ResizedCropSpec::eval(int64_t size, int64_t resize) {
  ResizedCropSpec s;
  s.random = false;
  s.out_h = s.out_w = size;
  s.resize_size = resize;
  s.hflip_probability = 0.0;
  return s;
}

void ResizedCropSpec::validate(int64_t channels) const {
  TANDEM_CHECK_ARG(out_h > 0 && out_w > 0 && out_h <= 16384 && out_w <= 16384, "output size ",
                   out_h, "x", out_w, " is not valid: expected 1..16384 a side");
  TANDEM_CHECK_ARG(scale_min > 0 && scale_min <= scale_max && scale_max <= 1.0, "scale range [",
                   scale_min, ", ", scale_max, "] is not valid: expected 0 < min <= max <= 1");
  TANDEM_CHECK_ARG(ratio_min > 0 && ratio_min <= ratio_max, "ratio range [", ratio_min, ", ",
                   ratio_max, "] is not valid: expected 0 < min <= max");
  TANDEM_CHECK_ARG(random || (resize_size >= out_h && resize_size >= out_w && resize_size <= 16384),
                   "resize size ", resize_size, " is not valid for a center crop of ", out_h, "x",
                   out_w, ": expected at least the crop's sides (and at most 16384)");
  TANDEM_CHECK_ARG(hflip_probability >= 0 && hflip_probability <= 1, "flip probability ",
                   hflip_probability, " is not valid: expected 0..1");
  detail::check_normalization(channels, kCropMaxChannels, mean, std);
}

namespace {
crop_math::DrawSpec draw_spec_of(const ResizedCropSpec& s) {
  crop_math::DrawSpec d{};
  d.random = s.random ? 1 : 0;
  d.out_h = static_cast<int>(s.out_h);
  d.out_w = static_cast<int>(s.out_w);
  d.scale_min = s.scale_min;
  d.scale_max = s.scale_max;
  d.ratio_min = s.ratio_min;
  d.ratio_max = s.ratio_max;
  d.log_ratio_min = std::log(s.ratio_min);
  d.log_ratio_max = std::log(s.ratio_max);
  d.resize_size = static_cast<int>(s.resize_size);
  d.hflip_probability = s.hflip_probability;
  return d;
}

void check_sizes(const at::Tensor& sizes) {
  TANDEM_CHECK_ARG(sizes.scalar_type() == at::kLong && sizes.dim() == 2 && sizes.size(1) == 3,
                   "image sizes must be (B, 3) int64 (H, W, C per sample), got ",
                   sizes.scalar_type(), " ", sizes.sizes());
}
}  // namespace

at::Tensor draw_crop_boxes(const ResizedCropSpec& spec, const at::Tensor& sizes,
                           at::Generator generator) {
  spec.validate(static_cast<int64_t>(spec.mean.size()));
  check_sizes(sizes);
  const int64_t B = sizes.size(0);
  const crop_math::DrawSpec ds = draw_spec_of(spec);
  at::Tensor boxes = at::empty({B, kCropBoxFields}, sizes.options().dtype(at::kInt));
  const at::Tensor s = sizes.contiguous();
  if (!sizes.is_cuda()) {
    const uint64_t seed = next_host_seed(generator);
    const int64_t* sz = s.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TANDEM_CHECK_ARG(sz[b * 3] >= 1 && sz[b * 3 + 1] >= 1, "sample ", b, " is ", sz[b * 3], "x",
                       sz[b * 3 + 1], ": expected a non-empty image");
      crop_math::draw_box(ds, static_cast<int>(sz[b * 3]), static_cast<int>(sz[b * 3 + 1]), seed, 0,
                          static_cast<uint64_t>(b), boxes.data_ptr<int32_t>() + b * kCropBoxFields);
    }
    return boxes;
  }
  const c10::cuda::CUDAGuard guard(sizes.device());
  CropDrawLaunch d{};
  d.spec = ds;
  d.rng = next_device_rng(generator, sizes.device());
  d.batch = static_cast<int>(B);
  d.sizes = s.data_ptr<int64_t>();
  d.boxes = boxes.data_ptr<int32_t>();
  launch_crop_draw(d, c10::cuda::getCurrentCUDAStream(sizes.device().index()).stream());
  return boxes;
}

void draw_crop_box(const ResizedCropSpec& spec, int64_t height, int64_t width,
                   const SampleDraw& draw, int32_t* box) {
  TANDEM_CHECK_ARG(height >= 1 && width >= 1 && height <= INT32_MAX && width <= INT32_MAX,
                   "an image of ", height, "x", width, " pixels: expected a non-empty image");
  crop_math::draw_box(draw_spec_of(spec), static_cast<int>(height), static_cast<int>(width),
                      draw.seed, 0, draw.position, box);
}

void place_crop_box(int32_t* box, double top, double left, double height, double width,
                    int64_t region_h, int64_t region_w) {
  namespace cm = crop_math;
  // One axis: whole pixels, the start's eighths and the length's extra eighths, so that the
  // taps' end, ceil(start + length), stays inside the region.
  auto axis = [](double start, double length, int64_t size, int32_t* whole, int32_t* len,
                 int32_t* sub) {
    int64_t s8 = std::llround(start * 8), l8 = std::llround(length * 8);
    s8 = std::clamp<int64_t>(s8, 0, size * 8 - 8);
    l8 = std::clamp<int64_t>(l8, 8, size * 8 - s8);
    *whole = static_cast<int32_t>(s8 / 8);
    const int64_t start_sub = s8 % 8;
    // The whole-pixel length that leaves the extra eighths in [0, 8).
    *len = static_cast<int32_t>(l8 / 8);
    *sub = static_cast<int32_t>(start_sub + 8 * (l8 % 8));
  };
  TANDEM_CHECK_ARG(region_h >= 1 && region_w >= 1, "a region of ", region_h, "x", region_w,
                   " pixels: expected a non-empty one");
  axis(top, height, region_h, &box[cm::kTop], &box[cm::kHeight], &box[cm::kSubY]);
  axis(left, width, region_w, &box[cm::kLeft], &box[cm::kWidth], &box[cm::kSubX]);
}

FeedStage given_crop_feed(const ResizedCropSpec& spec, bool channels_last, const std::string& field,
                          const std::string& boxes_field) {
  FeedStage f;
  f.name = "augment";
  f.lane = "augment";
  f.inputs = {field, offsets_field(field), sizes_field(field), boxes_field};
  f.outputs = {"x"};
  f.fn = [spec = spec.laid_out(channels_last)](const Tensors& in) {
    return Tensors{resized_crop(in[0], in[1], in[2], in[3], spec)};
  };
  f.what = spec.random ? "RandomResizedCrop (boxes from the loader) + flip + normalize"
                       : "Resize + CenterCrop (boxes from the loader) + normalize";
  f.capture = Capture::kNever;  // one resample kernel per batch, of varying sizes
  return f;
}

namespace {
// The reference for one sample: the kernel's loop, pixel by pixel.
void crop_one(const uint8_t* src, int h, int w, int c_in, const int32_t* box,
              const ResizedCropSpec& spec, const crop_math::Normalization* norm, float* out) {
  namespace cm = crop_math;
  const int C = static_cast<int>(spec.mean.size()), oh = static_cast<int>(spec.out_h),
            ow = static_cast<int>(spec.out_w);
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  if (c_in != C) {
    std::fill(out, out + C * plane, NAN);
    return;
  }
  const cm::Layout layout = cm::layout_of(spec.planar, h, w, C);
  std::vector<cm::AxisWindow> cols(ow);
  for (int x = 0; x < ow; ++x)
    cols[x] = cm::axis_window(box[cm::kOffsetX] + (box[cm::kFlip] ? ow - 1 - x : x),
                              box[cm::kWidth], box[cm::kResizedW], box[cm::kSubX]);
  for (int y = 0; y < oh; ++y) {
    const cm::AxisWindow rows = cm::axis_window(box[cm::kOffsetY] + y, box[cm::kHeight],
                                                box[cm::kResizedH], box[cm::kSubY]);
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < C; ++c) {
        const float v = cm::resample(src, layout, c, box[cm::kTop], box[cm::kLeft], rows, cols[x]);
        out[c * plane + y * ow + x] = cm::normalize(v, norm[c]);
      }
  }
}
}  // namespace

at::Tensor resized_crop(const at::Tensor& packed, const at::Tensor& offsets,
                        const at::Tensor& sizes, const at::Tensor& boxes,
                        const ResizedCropSpec& spec) {
  const int64_t C = static_cast<int64_t>(spec.mean.size());
  spec.validate(C);
  check_sizes(sizes);
  const int64_t B = sizes.size(0);
  TANDEM_CHECK_ARG(packed.scalar_type() == at::kByte && packed.dim() == 1,
                   "packed images must be 1-D uint8, got ", packed.scalar_type(), " ",
                   packed.sizes());
  TANDEM_CHECK_ARG(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && offsets.size(0) == B,
                   "image offsets must be (", B, ",) int64, got ", offsets.scalar_type(), " ",
                   offsets.sizes());
  TANDEM_CHECK_ARG(boxes.scalar_type() == at::kInt && boxes.dim() == 2 && boxes.size(0) == B &&
                       boxes.size(1) == kCropBoxFields,
                   "boxes must be (", B, ", ", kCropBoxFields, ") int32, got ", boxes.scalar_type(),
                   " ", boxes.sizes());
  for (const at::Tensor* t : {&offsets, &sizes, &boxes})
    TANDEM_CHECK_ARG(t->device() == packed.device(), "images on ", packed.device(),
                     " but offsets, sizes or boxes on ", t->device());
  crop_math::Normalization norm[kCropMaxChannels];
  for (int64_t c = 0; c < C; ++c) norm[c] = crop_math::normalization(spec.mean[c], spec.std[c]);
  at::Tensor out = at::empty(
      {B, C, spec.out_h, spec.out_w},
      packed.options()
          .dtype(at::kFloat)
          .memory_format(spec.channels_last && packed.is_cuda() ? at::MemoryFormat::ChannelsLast
                                                                : at::MemoryFormat::Contiguous));
  const at::Tensor p = packed.contiguous(), o = offsets.contiguous(), s = sizes.contiguous(),
                   bx = boxes.contiguous();
  if (packed.is_cuda()) {
    const c10::cuda::CUDAGuard guard(packed.device());
    CropLaunch a{};
    a.packed = p.data_ptr<uint8_t>();
    a.offsets = o.data_ptr<int64_t>();
    a.sizes = s.data_ptr<int64_t>();
    a.boxes = bx.data_ptr<int32_t>();
    a.out = out.data_ptr<float>();
    a.batch = static_cast<int>(B);
    a.channels = static_cast<int>(C);
    a.out_h = static_cast<int>(spec.out_h);
    a.out_w = static_cast<int>(spec.out_w);
    a.planar = spec.planar;
    a.channels_last = spec.channels_last;
    for (int64_t c = 0; c < C; ++c) a.normalization[c] = norm[c];
    launch_resized_crop(a, c10::cuda::getCurrentCUDAStream(packed.device().index()).stream());
    return out;
  }
  const int64_t* off = o.data_ptr<int64_t>();
  const int64_t* sz = s.data_ptr<int64_t>();
  const int32_t* bxp = bx.data_ptr<int32_t>();
  const int64_t n = p.numel();
  for (int64_t b = 0; b < B; ++b)  // the loader's layout, checked where it is cheap
    TANDEM_CHECK_ARG(off[b] >= 0 && off[b] + sz[b * 3] * sz[b * 3 + 1] * sz[b * 3 + 2] <= n,
                     "sample ", b, " (offset ", off[b], ", size ", sz[b * 3], "x", sz[b * 3 + 1],
                     "x", sz[b * 3 + 2], ") lies outside the ", n, " packed bytes");
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      crop_one(p.data_ptr<uint8_t>() + off[b], static_cast<int>(sz[b * 3]),
               static_cast<int>(sz[b * 3 + 1]), static_cast<int>(sz[b * 3 + 2]),
               bxp + b * kCropBoxFields, spec, norm,
               out.data_ptr<float>() + b * C * spec.out_h * spec.out_w);
  });
  // The reference writes planes; channels-last as the kernel's layout, the same values.
  return spec.channels_last ? out.contiguous(at::MemoryFormat::ChannelsLast) : out;
}

FeedStage resized_crop_feed(const ResizedCropSpec& spec, at::Generator generator,
                            bool channels_last, const std::string& field) {
  FeedStage f;
  f.name = "augment";
  f.lane = "augment";
  f.inputs = {field, offsets_field(field), sizes_field(field)};
  f.outputs = {"x"};
  f.fn = [spec = spec.laid_out(channels_last), generator](const Tensors& in) {
    const at::Tensor boxes = draw_crop_boxes(spec, in[2], generator);
    return Tensors{resized_crop(in[0], in[1], in[2], boxes, spec)};
  };
  f.what = spec.random ? "RandomResizedCrop + flip + normalize of the packed batch"
                       : "Resize + CenterCrop + normalize of the packed batch";
  f.generators = {generator};
  f.capture = Capture::kNever;  // one draw and one resample kernel per batch, of varying sizes
  return f;
}

}  // namespace tandem
