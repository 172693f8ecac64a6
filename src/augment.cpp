// Augmentation: validation, parameter draws (device and host), dispatch, and the C++ reference.
#include "tandem/augment.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "check_normalization.h"
#include "draw_seeds.h"
#include "kernels/augment_draw.h"
#include "kernels/augment_launch.h"
#include "kernels/augment_math.h"
#include "plane_textures.h"
#include "tandem/error.h"

namespace tandem {

namespace {
augment_math::Geometry geometry_of(const AugmentSpec& s, int64_t in_h, int64_t in_w) {
  return augment_math::make_geometry(static_cast<int>(in_h), static_cast<int>(in_w),
                                     static_cast<int>(s.crop_h), static_cast<int>(s.crop_w),
                                     static_cast<int>(s.out_h), static_cast<int>(s.out_w));
}
}  // namespace

void AugmentSpec::validate(int64_t channels, int64_t in_h, int64_t in_w) const {
  TANDEM_CHECK_ARG(crop_h > 0 && crop_w > 0, "crop ", crop_h, "x", crop_w,
                   " is not valid: expected positive sizes");
  TANDEM_CHECK_ARG(crop_h <= in_h && crop_w <= in_w, "crop ", crop_h, "x", crop_w,
                   " is larger than the image ", in_h, "x", in_w);
  TANDEM_CHECK_ARG(out_h > 0 && out_w > 0, "output size ", out_h, "x", out_w,
                   " is not valid: expected positive sizes");
  TANDEM_CHECK_ARG(max_rotation_deg >= 0 && max_rotation_deg <= 180, "max rotation ",
                   max_rotation_deg, " degrees is not valid: expected 0..180");
  TANDEM_CHECK_ARG(blur_kernel >= 1 && blur_kernel % 2 == 1 && blur_kernel <= 63,
                   "blur kernel size ", blur_kernel, " is not valid: expected an odd number 1..63");
  TANDEM_CHECK_ARG(blur_kernel / 2 < std::min(out_h, out_w), "blur kernel size ", blur_kernel,
                   " is too large for a ", out_h, "x", out_w, " output (reflect padding needs ",
                   "the radius below the size)");
  TANDEM_CHECK_ARG(sigma_min > 0 && sigma_max >= sigma_min, "sigma range [", sigma_min, ", ",
                   sigma_max, "] is not valid: expected 0 < min <= max");
  detail::check_normalization(channels, kAugmentMaxChannels, mean, std);
  TANDEM_CHECK_ARG(hflip_probability >= 0 && hflip_probability <= 1, "flip probability ",
                   hflip_probability, " is not valid: expected 0..1");
}

AugmentParams AugmentParams::to(c10::Device device) const {
  return {top.to(device),   left.to(device),  angle_deg.to(device),    cos_a.to(device),
          sin_a.to(device), sigma.to(device), blur_weights.to(device), flip.to(device)};
}

namespace {
augment_math::DrawSpec draw_spec_of(const AugmentSpec& s, int64_t in_h, int64_t in_w) {
  return {static_cast<int>(in_h),
          static_cast<int>(in_w),
          static_cast<int>(s.crop_h),
          static_cast<int>(s.crop_w),
          s.max_rotation_deg,
          s.sigma_min,
          s.sigma_max,
          s.hflip_probability,
          static_cast<int>(s.blur_kernel)};
}

AugmentParams empty_params(int64_t batch_size, int64_t taps, c10::Device device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto i32 = at::TensorOptions().dtype(at::kInt).device(device);
  AugmentParams p;
  p.top = at::empty({batch_size}, i32);
  p.left = at::empty({batch_size}, i32);
  p.flip = at::empty({batch_size}, i32);
  p.angle_deg = at::empty({batch_size}, f32);
  p.cos_a = at::empty({batch_size}, f32);
  p.sin_a = at::empty({batch_size}, f32);
  p.sigma = at::empty({batch_size}, f32);
  p.blur_weights = at::empty({batch_size, taps}, f32);
  return p;
}

// Draws on the host into CPU tensors: sample `first + b` of the draw keyed by (seed, offset).
void draw_on_host(const augment_math::DrawSpec& ds, uint64_t seed, uint64_t offset, uint64_t first,
                  AugmentParams& p) {
  for (int64_t b = 0; b < p.batch_size(); ++b) {
    const augment_math::Drawn d =
        augment_math::draw_sample(ds, seed, offset, first + static_cast<uint64_t>(b),
                                  p.blur_weights.data_ptr<float>() + b * ds.taps);
    p.top.data_ptr<int32_t>()[b] = d.top;
    p.left.data_ptr<int32_t>()[b] = d.left;
    p.flip.data_ptr<int32_t>()[b] = d.flip;
    p.angle_deg.data_ptr<float>()[b] = d.angle_deg;
    p.cos_a.data_ptr<float>()[b] = d.cos_a;
    p.sin_a.data_ptr<float>()[b] = d.sin_a;
    p.sigma.data_ptr<float>()[b] = d.sigma;
  }
}
}  // namespace

AugmentParams draw_augment_params(const AugmentSpec& spec, int64_t batch_size, int64_t in_h,
                                  int64_t in_w, c10::Device device, at::Generator generator) {
  spec.validate(static_cast<int64_t>(spec.mean.size()), in_h, in_w);
  TANDEM_CHECK_ARG(batch_size >= 0, "batch size ", batch_size, " is not valid");
  const augment_math::DrawSpec ds = draw_spec_of(spec, in_h, in_w);
  AugmentParams p = empty_params(batch_size, spec.blur_kernel, device);
  if (!device.is_cuda()) {
    draw_on_host(ds, next_host_seed(generator), 0, 0, p);
    return p;
  }
  DrawLaunch d{};
  d.spec = ds;
  d.rng = next_device_rng(generator, device);
  d.batch = static_cast<int>(batch_size);
  d.top = p.top.data_ptr<int32_t>();
  d.left = p.left.data_ptr<int32_t>();
  d.flip = p.flip.data_ptr<int32_t>();
  d.angle_deg = p.angle_deg.data_ptr<float>();
  d.cos_a = p.cos_a.data_ptr<float>();
  d.sin_a = p.sin_a.data_ptr<float>();
  d.sigma = p.sigma.data_ptr<float>();
  d.weights = p.blur_weights.data_ptr<float>();
  launch_draw(d, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  return p;
}

AugmentParams draw_augment_params_host(const AugmentSpec& spec, int64_t in_h, int64_t in_w,
                                       uint64_t seed, int64_t index) {
  AugmentParams p = empty_params(1, spec.blur_kernel, c10::Device(c10::kCPU));
  draw_on_host(draw_spec_of(spec, in_h, in_w), seed ^ 0xA5A5A5A5A5A5A5A5ull, 0,
               static_cast<uint64_t>(index), p);
  return p;
}

namespace {

// The reference's arithmetic for one sample. Built twice: for x86-64-v3 (AVX2 and FMA, where
// augment_math::fmadd is one instruction and the loops vectorize) and for any x86-64 (fmadd is
// std::fma, exact but slower); the loader picks the first the CPU supports. Both give the same
// bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void augment_one(const uint8_t* src, int64_t C, int64_t H, int64_t W,
                 const augment_math::SampleParams& p, const float* w, const AugmentSpec& spec,
                 float* dst) {
  namespace am = augment_math;
  const am::Geometry g = geometry_of(spec, H, W);
  const int taps = static_cast<int>(spec.blur_kernel), r = taps / 2;
  const int oh = g.out_h, ow = g.out_w;
  const size_t plane = static_cast<size_t>(oh) * ow;
  // unit_byte of every byte, looked up: a load per texel instead of three dependent
  // floating-point operations.
  static const std::array<float, 256> unit = [] {
    std::array<float, 256> values{};
    for (int v = 0; v < 256; ++v) values[v] = am::unit_byte(static_cast<uint8_t>(v));
    return values;
  }();
  auto unit_of = [](uint8_t v) { return unit[v]; };
  // The resize's taps of every resized column and row (axis_tap once each, like the kernel's
  // tables); then each output pixel rotates back to a resized pixel and looks its taps up —
  // locate_centred()'s values — and reads all channels there, so a location is made and read
  // once.
  std::vector<am::AxisTap> column_taps(ow), row_taps(oh);
  for (int ci = 0; ci < ow; ++ci)
    column_taps[ci] = am::axis_tap(ci, g.scale_x, g.shift_x, g.crop_w, p.left);
  for (int ri = 0; ri < oh; ++ri)
    row_taps[ri] = am::axis_tap(ri, g.scale_y, g.shift_y, g.crop_h, p.top);
  std::vector<float> sampled(static_cast<size_t>(C) * plane), rows(plane);
  for (int i = 0; i < oh; ++i) {
    const am::RowTerms terms = am::row_terms(g, p.cos_a, p.sin_a, am::centre_offset(i, oh));
    for (int j = 0; j < ow; ++j) {
      const float u = am::centre_offset(j, ow);
      const am::Resized at = am::rotate_back(g, p.cos_a, p.sin_a, p.flip ? -u : u, terms);
      const am::Tap t{at.inside, at.inside ? column_taps[at.ci] : am::AxisTap{},
                      at.inside ? row_taps[at.ri] : am::AxisTap{}};
      for (int64_t c = 0; c < C; ++c)
        sampled[c * plane + i * ow + j] = am::read(src + c * H * W, g.in_w, t, unit_of);
    }
  }
  const float* rot = nullptr;  // the channel being blurred
  // Blur taps in the same order as the kernel's (augment_math::blur_taps): the interior loops
  // index directly so the compiler can vectorize across j; only the borders reflect.
  auto h_pass = [&](int i, int j) {
    return am::blur_taps(w, taps, [&](int k) { return rot[i * ow + am::reflect(j + k - r, ow)]; });
  };
  auto v_pass = [&](int i, int j) {
    return am::blur_taps(w, taps, [&](int k) { return rows[am::reflect(i + k - r, oh) * ow + j]; });
  };
  for (int64_t c = 0; c < C; ++c) {
    rot = sampled.data() + c * plane;
    for (int i = 0; i < oh; ++i) {
      const float* in = rot + i * ow;
      float* o = rows.data() + i * ow;
      for (int j = 0; j < std::min(r, ow); ++j) o[j] = h_pass(i, j);
      // k outermost, as in the vertical pass: each output still adds k = 0, 1, ... in order, and
      // the j loop vectorizes (one output's taps in a row were a chain of dependent multiply-
      // adds, a third of this function's time).
      for (int j = r; j < ow - r; ++j) o[j] = 0.0f;
      for (int k = 0; k < taps; ++k) {
        const float wk = w[k];
        const float* shifted = in + k - r;
        for (int j = r; j < ow - r; ++j) o[j] = am::fmadd(wk, shifted[j], o[j]);
      }
      for (int j = std::max(r, ow - r); j < ow; ++j) o[j] = h_pass(i, j);
    }
    const am::Normalization n = am::normalization(spec.mean[c], spec.std[c]);
    float* o = dst + c * oh * ow;
    for (int i = 0; i < oh; ++i) {
      if (i < r || i >= oh - r) {
        for (int j = 0; j < ow; ++j) o[i * ow + j] = am::normalize(v_pass(i, j), n);
        continue;
      }
      float* line = o + i * ow;
      for (int j = 0; j < ow; ++j) line[j] = 0.0f;
      for (int k = 0; k < taps; ++k) {  // k outermost: each output still adds k = 0, 1, ...
        const float* in = rows.data() + (i + k - r) * ow;
        const float wk = w[k];
        for (int j = 0; j < ow; ++j) line[j] = am::fmadd(wk, in[j], line[j]);
      }
      for (int j = 0; j < ow; ++j) line[j] = am::normalize(line[j], n);
    }
  }
}

}  // namespace

void augment_sample_cpu(const at::Tensor& image, const AugmentParams& params, int64_t row,
                        const AugmentSpec& spec, at::Tensor& out) {
  const augment_math::SampleParams p{
      params.top.data_ptr<int32_t>()[row], params.left.data_ptr<int32_t>()[row],
      params.cos_a.data_ptr<float>()[row], params.sin_a.data_ptr<float>()[row],
      params.flip.data_ptr<int32_t>()[row]};
  const int64_t taps = spec.blur_kernel;
  augment_one(image.data_ptr<uint8_t>(), image.size(0), image.size(1), image.size(2), p,
              params.blur_weights.data_ptr<float>() + row * taps, spec, out.data_ptr<float>());
}

const char* to_string(AugmentSampling sampling) {
  switch (sampling) {
    case AugmentSampling::kAuto:
      return "auto";
    case AugmentSampling::kTextureGather:
      return "gather";
    case AugmentSampling::kStagedWindow:
      return "staged";
  }
  return "?";
}

AugmentSampling parse_augment_sampling(const std::string& name) {
  for (AugmentSampling s :
       {AugmentSampling::kAuto, AugmentSampling::kTextureGather, AugmentSampling::kStagedWindow})
    if (name == to_string(s)) return s;
  TANDEM_CHECK_ARG(false, "sampling '", name, "' is not valid: expected auto, gather or staged");
  return AugmentSampling::kAuto;
}

namespace {
// Textures for a launch on `src` (contiguous, on the current device), or why not (`out` then
// stays as the caller left it: empty).
std::string gather_textures(const at::Tensor& src, const AugmentSpec& spec, PlaneTextures& out) {
  const std::string why_not =
      why_no_gathers(static_cast<int>(src.size(1)), static_cast<int>(spec.blur_kernel));
  if (!why_not.empty()) return why_not;
  return plane_textures(*at::cuda::getDeviceProperties(src.device().index()),
                        src.data_ptr<uint8_t>(), src.size(0), src.size(1), src.size(2), src.size(3),
                        out);
}

AugmentSampling resolve(const at::Tensor& src, const AugmentSpec& spec, AugmentSampling requested,
                        PlaneTextures& textures) {
  textures = PlaneTextures{};
  if (requested == AugmentSampling::kStagedWindow) return requested;
  const std::string why_not = gather_textures(src, spec, textures);
  if (why_not.empty()) return AugmentSampling::kTextureGather;
  TANDEM_CHECK_ARG(requested == AugmentSampling::kAuto,
                   "texture gathers are not possible here: ", why_not);
  return AugmentSampling::kStagedWindow;
}
}  // namespace

AugmentSampling resolve_augment_sampling(const at::Tensor& images, const AugmentSpec& spec,
                                         AugmentSampling requested) {
  TANDEM_CHECK_ARG(images.is_cuda() && images.dim() == 4 && images.scalar_type() == at::kByte,
                   "sampling applies to (B, C, H, W) uint8 CUDA images");
  const c10::cuda::CUDAGuard guard(images.device());
  PlaneTextures unused;
  return resolve(images.contiguous(), spec, requested, unused);
}

at::Tensor augment(const at::Tensor& images, const AugmentParams& params, const AugmentSpec& spec,
                   AugmentSampling sampling) {
  TANDEM_CHECK_ARG(images.scalar_type() == at::kByte, "augment expects uint8 images, got ",
                   images.scalar_type());
  TANDEM_CHECK_ARG(images.dim() == 4, "augment expects (B, C, H, W) images, got ", images.dim(),
                   " dimensions");
  const int64_t B = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  spec.validate(C, H, W);
  TANDEM_CHECK_ARG(H * W <= INT32_MAX && spec.out_h * spec.out_w <= INT32_MAX, "image ", H, "x", W,
                   " or output ", spec.out_h, "x", spec.out_w,
                   " is too large: expected fewer than 2^31 pixels per channel");
  TANDEM_CHECK_ARG(params.batch_size() == B, "parameters for ", params.batch_size(),
                   " samples given for a batch of ", B);
  TANDEM_CHECK_ARG(params.top.device() == images.device(), "parameters on ", params.top.device(),
                   " but images on ", images.device());
  TANDEM_CHECK_ARG(params.blur_weights.size(1) == spec.blur_kernel, "blur weights have ",
                   params.blur_weights.size(1), " taps but the kernel size is ", spec.blur_kernel);
  const at::Tensor src = images.contiguous();
  at::Tensor out = at::empty({B, C, spec.out_h, spec.out_w}, images.options().dtype(at::kFloat));
  if (images.is_cuda()) {
    const c10::cuda::CUDAGuard guard(images.device());
    AugmentLaunch a{};
    resolve(src, spec, sampling, a.textures);
    a.images = src.data_ptr<uint8_t>();
    a.out = out.data_ptr<float>();
    a.batch = static_cast<int>(B);
    a.channels = static_cast<int>(C);
    a.geometry = geometry_of(spec, H, W);
    const at::Tensor top = params.top.contiguous(), left = params.left.contiguous(),
                     cs = params.cos_a.contiguous(), sn = params.sin_a.contiguous(),
                     flip = params.flip.contiguous(), w = params.blur_weights.contiguous();
    a.top = top.data_ptr<int32_t>();
    a.left = left.data_ptr<int32_t>();
    a.cos_a = cs.data_ptr<float>();
    a.sin_a = sn.data_ptr<float>();
    a.flip = flip.data_ptr<int32_t>();
    a.weights = w.data_ptr<float>();
    a.taps = static_cast<int>(spec.blur_kernel);
    a.programmatic_launch = at::cuda::getDeviceProperties(images.device().index())->major >= 9;
    for (int64_t c = 0; c < C; ++c)
      a.normalization[c] = augment_math::normalization(spec.mean[c], spec.std[c]);
    launch_augment(a, c10::cuda::getCurrentCUDAStream(images.device().index()).stream());
    return out;
  }
  const AugmentParams p = params.to(c10::Device(c10::kCPU));
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      at::Tensor o = out[b];
      augment_sample_cpu(src[b], p, b, spec, o);
    }
  });
  return out;
}

FeedStage augment_feed(const AugmentSpec& spec, at::Generator generator, const std::string& field) {
  FeedStage f;
  f.name = "augment";
  f.lane = "augment";
  f.inputs = {field};
  f.outputs = {field};
  f.fn = [spec, generator](const Tensors& in) {
    const at::Tensor& x = in[0];
    TANDEM_CHECK_ARG(x.dim() == 4 && x.scalar_type() == at::kByte,
                     "augment expects a (B, C, H, W) uint8 batch; got a ", x.scalar_type(),
                     " tensor of shape ", x.sizes());  // before the draw reads its sizes
    const AugmentParams p =
        draw_augment_params(spec, x.size(0), x.size(2), x.size(3), x.device(), generator);
    return Tensors{augment(x, p, spec)};
  };
  f.what = "parameters drawn from the run's generator, fused augment kernel";
  f.generators = {generator};
  return f;
}

}  // namespace tandem
