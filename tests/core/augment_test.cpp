// Augmentation: known answers (identity, no-blur, 90-degree rotation, torch's own resize and
// blur), per-sample parameters and their ranges, determinism, input validation, and CPU/GPU
// parity (GPU tests carry the label gpu).
#include "tandem/augment.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace {

at::Tensor random_images(int64_t b, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, 256, {b, c, h, w}, gen, at::TensorOptions().dtype(at::kByte));
}

AugmentSpec spec_for(int64_t crop, int64_t out, int64_t taps) {
  AugmentSpec s;
  s.crop_h = s.crop_w = crop;
  s.out_h = s.out_w = out;
  s.blur_kernel = taps;
  return s;
}

// Parameters chosen by the test, not drawn: every sample gets the same values.
AugmentParams fixed_params(int64_t b, int top, int left, float cos_a, float sin_a, int flip,
                           float sigma, int64_t taps) {
  AugmentParams p;
  p.top = at::full({b}, top, at::kInt);
  p.left = at::full({b}, left, at::kInt);
  p.angle_deg = at::zeros({b}, at::kFloat);
  p.cos_a = at::full({b}, cos_a, at::kFloat);
  p.sin_a = at::full({b}, sin_a, at::kFloat);
  p.flip = at::full({b}, flip, at::kInt);
  p.sigma = at::full({b}, sigma, at::kFloat);
  const at::Tensor x = at::arange(taps, at::kFloat).sub_((taps - 1) / 2.0);
  at::Tensor w = at::exp(x.div(sigma).pow(2).mul(-0.5));
  p.blur_weights = (w / w.sum()).unsqueeze(0).expand({b, taps}).contiguous();
  return p;
}

// "first mismatch at (b, c, i, j): got x, want y" or "" when within tolerance.
std::string first_mismatch(const at::Tensor& got, const at::Tensor& want, double tol) {
  const at::Tensor bad = (got - want).abs().gt(tol) | got.isnan();
  if (!bad.any().item<bool>()) return "";
  const at::Tensor idx = bad.nonzero()[0];
  const at::Tensor flat_bad = bad.reshape(-1).nonzero()[0];
  const int64_t flat = flat_bad.item<int64_t>();
  std::ostringstream os;
  os << "first mismatch at (";
  for (int64_t d = 0; d < idx.numel(); ++d) os << (d ? ", " : "") << idx[d].item<int64_t>();
  os << "): got " << got.reshape(-1)[flat].item<float>() << ", want "
     << want.reshape(-1)[flat].item<float>();
  return os.str();
}

TEST(AugmentTest, IdentityWithoutCropRotationOrBlurIsTheImageNormalized) {
  const at::Tensor img = random_images(1, 3, 24, 24, 1);
  AugmentSpec s = spec_for(24, 24, 1);
  s.mean = {10, 20, 30};
  s.std = {2, 4, 8};
  const at::Tensor out = augment(img, fixed_params(1, 0, 0, 1.f, 0.f, 0, 1.f, 1), s);
  const at::Tensor mean = at::tensor({10.f, 20.f, 30.f}).view({1, 3, 1, 1});
  const at::Tensor sd = at::tensor({2.f, 4.f, 8.f}).view({1, 3, 1, 1});
  const at::Tensor want = (img.to(at::kFloat) - mean) / sd;
  // Up to rounding: sampling works in units of 1/255 and normalize scales back (|want| < 128).
  EXPECT_EQ(first_mismatch(out, want, 1e-4), "");
}

// Every byte value in each channel: row y, column x of channel c holds (x + 37 y + 101 c) % 256.
at::Tensor every_byte_image() {
  const at::Tensor column = at::arange(256, at::kInt);
  return ((column.view({1, 1, 1, 256}) + at::arange(8, at::kInt).view({1, 1, 8, 1}) * 37 +
           at::arange(3, at::kInt).view({1, 3, 1, 1}) * 101) %
          256)
      .to(at::kByte);
}

// The identity augmentation of every_byte_image(), normalized with mean 0 and std `std`.
AugmentSpec every_byte_identity(double std) {
  AugmentSpec s = spec_for(8, 8, 1);
  s.crop_w = s.out_w = 256;
  s.std = {std, std, std};
  return s;
}

// Sampling reads a byte v as v / 255 correctly rounded (augment_math::unit_byte): std 255 makes
// normalize's scale 1 and shows those values; std 1 multiplies them back to v, exactly.
TEST(AugmentTest, SamplingReadsEveryByteAsItsCorrectlyRoundedQuotientBy255) {
  const at::Tensor img = every_byte_image();
  const auto p = fixed_params(1, 0, 0, 1.f, 0.f, 0, 1.f, 1);
  EXPECT_EQ(
      first_mismatch(augment(img, p, every_byte_identity(255)), img.to(at::kFloat) / 255.f, 0.0),
      "");
  EXPECT_EQ(first_mismatch(augment(img, p, every_byte_identity(1)), img.to(at::kFloat), 0.0), "");
}

TEST(AugmentTest, NinetyDegreesOfASquareCropIsATransposeFlip) {
  const at::Tensor img = random_images(2, 3, 16, 16, 2);
  const AugmentSpec s = spec_for(16, 16, 1);
  const at::Tensor out = augment(img, fixed_params(2, 0, 0, 0.f, 1.f, 0, 1.f, 1), s);
  // Counter-clockwise on the displayed image: out[i][j] = in[j][W-1-i], torch.rot90(k=1).
  EXPECT_EQ(first_mismatch(out, at::rot90(img, 1, {2, 3}).to(at::kFloat), 0.0), "");
  // And a flip mirrors the columns of that.
  const at::Tensor flipped = augment(img, fixed_params(2, 0, 0, 0.f, 1.f, 1, 1.f, 1), s);
  EXPECT_EQ(first_mismatch(flipped, at::rot90(img, 1, {2, 3}).flip({3}).to(at::kFloat), 0.0), "");
}

TEST(AugmentTest, CropResizeAndBlurMatchTorchsOwnOps) {
  // Odd sizes everywhere; angle 0 so the comparison needs no rotation.
  const at::Tensor img = random_images(1, 3, 37, 29, 3);
  AugmentSpec s;
  s.crop_h = 17;
  s.crop_w = 23;
  s.out_h = 31;
  s.out_w = 19;
  s.blur_kernel = 5;
  const int top = 9, left = 4;
  const float sigma = 1.3f;
  const auto p = fixed_params(1, top, left, 1.f, 0.f, 0, sigma, 5);
  const at::Tensor got = augment(img, p, s);
  const at::Tensor crop = img.to(at::kFloat).slice(2, top, top + 17).slice(3, left, left + 23);
  const at::Tensor resized = at::upsample_bilinear2d(crop, {31, 19}, /*align_corners=*/false);
  const at::Tensor k1 = p.blur_weights[0];
  const at::Tensor k2 = at::outer(k1, k1).expand({3, 1, 5, 5}).contiguous();
  const at::Tensor want =
      at::conv2d(at::reflection_pad2d(resized, {2, 2, 2, 2}), k2,
                 /*bias=*/std::nullopt, /*stride=*/at::IntArrayRef{1},
                 /*padding=*/at::IntArrayRef{0}, /*dilation=*/at::IntArrayRef{1},
                 /*groups=*/3);
  EXPECT_EQ(first_mismatch(got, want, 1e-3), "");
}

TEST(AugmentTest, BlurKernelOneMeansNoBlur) {
  const at::Tensor img = random_images(1, 1, 20, 20, 4);
  AugmentSpec s = spec_for(10, 20, 1);
  s.mean = {0};
  s.std = {1};
  const float c = std::cos(0.3f), sn = std::sin(0.3f);
  const at::Tensor sharp = augment(img, fixed_params(1, 3, 5, c, sn, 0, 1.f, 1), s);
  // A 3-tap blur whose weights are a delta (0, 1, 0) is the identity: kernel 1 must equal it.
  AugmentSpec three = s;
  three.blur_kernel = 3;
  auto delta = fixed_params(1, 3, 5, c, sn, 0, 1.f, 3);
  delta.blur_weights = at::tensor({0.f, 1.f, 0.f}).unsqueeze(0);
  EXPECT_EQ(first_mismatch(sharp, augment(img, delta, three), 0.0), "");
  // And a real 3-tap blur changes the image.
  const at::Tensor soft = augment(img, fixed_params(1, 3, 5, c, sn, 0, 1.f, 3), three);
  EXPECT_LT(soft.var().item<double>(), sharp.var().item<double>());
}

TEST(AugmentTest, ParametersAreDrawnPerSampleWithinTheirRanges) {
  const AugmentSpec s;  // the cls workload's defaults
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto p = draw_augment_params(s, 4000, 256, 256, c10::Device(c10::kCPU), gen);
  EXPECT_EQ(p.top.min().item<int>(), 0);
  EXPECT_EQ(p.top.max().item<int>(), 128);
  EXPECT_EQ(p.left.min().item<int>(), 0);
  EXPECT_EQ(p.left.max().item<int>(), 128);
  EXPECT_GE(p.angle_deg.min().item<float>(), -45.f);
  EXPECT_LE(p.angle_deg.max().item<float>(), 45.f);
  EXPECT_LT(p.angle_deg.min().item<float>(), -44.f);
  EXPECT_GT(p.angle_deg.max().item<float>(), 44.f);
  EXPECT_GE(p.sigma.min().item<float>(), 0.1f);
  EXPECT_LE(p.sigma.max().item<float>(), 2.0f);
  EXPECT_LT(p.sigma.min().item<float>(), 0.15f);
  EXPECT_GT(p.sigma.max().item<float>(), 1.95f);
  EXPECT_TRUE(at::allclose(p.blur_weights.sum(1), at::ones({4000})));
  EXPECT_EQ(p.flip.sum().item<int>(), 0);  // probability 0 by default
  EXPECT_TRUE(at::allclose(p.cos_a.pow(2) + p.sin_a.pow(2), at::ones({4000}), 1e-5, 1e-5));
}

TEST(AugmentTest, TwoSamplesOfABatchGetDifferentParametersAndOutputs) {
  const at::Tensor one = random_images(1, 3, 64, 64, 5);
  const at::Tensor img = at::cat({one, one});  // the same image twice
  const AugmentSpec s = spec_for(32, 48, 7);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const auto p = draw_augment_params(s, 2, 64, 64, c10::Device(c10::kCPU), gen);
  EXPECT_NE(p.angle_deg[0].item<float>(), p.angle_deg[1].item<float>());
  EXPECT_NE(p.sigma[0].item<float>(), p.sigma[1].item<float>());
  const at::Tensor out = augment(img, p, s);
  EXPECT_FALSE(out[0].equal(out[1]));
}

TEST(AugmentTest, SameSeedSameParametersAndOutputs) {
  const at::Tensor img = random_images(3, 3, 64, 64, 6);
  const AugmentSpec s = spec_for(32, 48, 7);
  auto run = [&](uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto p = draw_augment_params(s, 3, 64, 64, c10::Device(c10::kCPU), gen);
    return std::make_pair(p.angle_deg, augment(img, p, s));
  };
  const auto a = run(11), b = run(11), c = run(12);
  EXPECT_TRUE(a.first.equal(b.first));
  EXPECT_TRUE(a.second.equal(b.second));
  EXPECT_FALSE(a.first.equal(c.first));
}

TEST(AugmentTest, AugmentFeedDrawsFromItsSeededGeneratorAsAPlainLoopWould) {
  const at::Tensor img = random_images(3, 3, 64, 64, 6);
  const AugmentSpec s = spec_for(32, 48, 7);
  const c10::Device cpu(c10::kCPU);
  const FeedStage stage = augment_feed(s, seeded_generator(cpu, 11), "pixels");
  EXPECT_EQ(stage.lane, "augment");
  EXPECT_EQ(stage.inputs, std::vector<std::string>{"pixels"});
  EXPECT_EQ(stage.outputs, std::vector<std::string>{"pixels"});
  ASSERT_EQ(stage.generators.size(), 1u);
  // Two batches through the stage: what draw + augment give from a generator seeded alike.
  const at::Generator loop_gen = seeded_generator(cpu, 11);
  for (int step = 0; step < 2; ++step) {
    const Tensors out = stage.fn({img});
    const auto p = draw_augment_params(s, 3, 64, 64, cpu, loop_gen);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].equal(augment(img, p, s))) << "step " << step;
  }
  try {
    stage.fn({img.to(at::kFloat)});
    ADD_FAILURE() << "a float batch was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("uint8 batch; got a Float tensor of shape [3, 3, 64, 64]"),
              std::string::npos)
        << e.what();
  }
}

TEST(AugmentTest, HostDrawsAreAFunctionOfSeedAndIndex) {
  const AugmentSpec s;
  const auto a = draw_augment_params_host(s, 256, 256, 3, 10);
  const auto b = draw_augment_params_host(s, 256, 256, 3, 10);
  const auto c = draw_augment_params_host(s, 256, 256, 3, 11);
  EXPECT_TRUE(a.angle_deg.equal(b.angle_deg) && a.top.equal(b.top) && a.sigma.equal(b.sigma));
  EXPECT_FALSE(a.angle_deg.equal(c.angle_deg));
  float lo = 1e9, hi = -1e9;
  for (int i = 0; i < 2000; ++i) {
    const float angle = draw_augment_params_host(s, 256, 256, 3, i).angle_deg.item<float>();
    lo = std::min(lo, angle);
    hi = std::max(hi, angle);
  }
  EXPECT_GE(lo, -45.f);
  EXPECT_LE(hi, 45.f);
  EXPECT_LT(lo, -44.f);
  EXPECT_GT(hi, 44.f);
}

TEST(AugmentTest, RejectsBadInputNamingTheValue) {
  const at::Tensor img = random_images(1, 3, 32, 32, 9);
  const auto p = fixed_params(1, 0, 0, 1.f, 0.f, 0, 1.f, 7);
  auto expect_error = [&](AugmentSpec s, const at::Tensor& images, const std::string& text) {
    try {
      augment(images, p, s);
      ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  AugmentSpec s = spec_for(16, 32, 7);
  AugmentSpec bad = s;
  bad.crop_h = bad.crop_w = 40;
  expect_error(bad, img, "crop 40x40 is larger than the image 32x32");
  bad = s;
  bad.blur_kernel = 6;
  expect_error(bad, img, "blur kernel size 6 is not valid");
  bad.blur_kernel = 0;
  expect_error(bad, img, "blur kernel size 0 is not valid");
  bad = s;
  bad.sigma_min = 2.0;
  bad.sigma_max = 0.1;
  expect_error(bad, img, "sigma range [2, 0.1] is not valid");
  bad = s;
  bad.mean = {0, 0};
  expect_error(bad, img, "mean has 2 values for 3 channels");
  bad = s;
  bad.std = {1, 0, 1};
  expect_error(bad, img, "std[1] is 0");
  expect_error(s, img.to(at::kFloat), "augment expects uint8 images");
  expect_error(s, img[0], "augment expects (B, C, H, W) images, got 3 dimensions");
}

// --- GPU: the kernel against the C++ reference, on the same parameters ---

void expect_gpu_matches_cpu(const AugmentSpec& s, int64_t b, int64_t c, int64_t h, int64_t w,
                            uint64_t seed, AugmentSampling sampling = AugmentSampling::kAuto) {
  const at::Tensor img = random_images(b, c, h, w, seed);
  auto gen = at::cuda::detail::createCUDAGenerator(0);
  gen.set_current_seed(seed);
  const c10::Device cuda(c10::kCUDA, 0);
  const auto p = draw_augment_params(s, b, h, w, cuda, gen);
  at::Tensor dev = augment(img.to(cuda), p, s, sampling).cpu();
  at::Tensor host = augment(img, p.to(c10::Device(c10::kCPU)), s);
  EXPECT_EQ(first_mismatch(dev, host, 1e-5), "")
      << "max |gpu - cpu| = " << (dev - host).abs().max().item<float>();
}

TEST(AugmentGpuTest, KernelMatchesTheCppReferenceOnClsSizes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  AugmentSpec s;
  s.hflip_probability = 0.5;
  for (AugmentSampling sampling :
       {AugmentSampling::kTextureGather, AugmentSampling::kStagedWindow}) {
    SCOPED_TRACE(to_string(sampling));
    expect_gpu_matches_cpu(s, 6, 3, 256, 256, 21, sampling);
  }
}

// The texture path uses the normalized floats the texture unit returns as they are: the same
// values as the C++ reference only if the unit rounds v / 255 correctly, for every byte. The
// identity augmentation of SamplingReadsEveryByteAsItsCorrectlyRoundedQuotientBy255 shows them.
TEST(AugmentGpuTest, TextureGathersReadEveryByteExactly) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const at::Tensor img = every_byte_image();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto p = fixed_params(1, 0, 0, 1.f, 0.f, 0, 1.f, 1);
  for (double std : {255.0, 1.0}) {
    const AugmentSpec s = every_byte_identity(std);
    const at::Tensor want = augment(img, p, s);
    for (AugmentSampling sampling :
         {AugmentSampling::kTextureGather, AugmentSampling::kStagedWindow}) {
      SCOPED_TRACE(std::string(to_string(sampling)) + ", std " + std::to_string(std));
      const at::Tensor out = augment(img.to(cuda), p.to(cuda), s, sampling).cpu();
      EXPECT_EQ(first_mismatch(out, want, 0.0), "");
    }
  }
}

// Two textures' worth of samples and one more (a texture holds as many samples of 3 x 256 rows
// as the device's 2D texture height allows: 84 on an H200, so 169 samples, three textures, the
// last with one sample): the samples past the first texture read the next ones.
TEST(AugmentGpuTest, TextureGathersSpanSeveralTexturesInALargeBatch) {
  TANDEM_SKIP_WITHOUT_CUDA();
  AugmentSpec s;
  s.hflip_probability = 0.5;
  int max_rows = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&max_rows, cudaDevAttrMaxTexture2DLinearHeight, 0), cudaSuccess);
  const int64_t b = 2 * (max_rows / (3 * 256)) + 1;
  const c10::Device cuda(c10::kCUDA, 0);
  const at::Tensor img = random_images(b, 3, 256, 256, 50).to(cuda);
  auto gen = at::cuda::detail::createCUDAGenerator(0);
  gen.set_current_seed(50);
  const auto p = draw_augment_params(s, b, 256, 256, cuda, gen);
  ASSERT_EQ(resolve_augment_sampling(img, s, AugmentSampling::kAuto),
            AugmentSampling::kTextureGather);
  const at::Tensor gathered = augment(img, p, s, AugmentSampling::kTextureGather);
  const at::Tensor staged = augment(img, p, s, AugmentSampling::kStagedWindow);
  EXPECT_EQ(first_mismatch(gathered.cpu(), staged.cpu(), 0.0), "");
  // And the last sample against the C++ reference (the staged path is checked against it above).
  const at::Tensor host = augment(
      img[b - 1].unsqueeze(0).cpu(),
      AugmentParams{p.top.slice(0, b - 1), p.left.slice(0, b - 1), p.angle_deg.slice(0, b - 1),
                    p.cos_a.slice(0, b - 1), p.sin_a.slice(0, b - 1), p.sigma.slice(0, b - 1),
                    p.blur_weights.slice(0, b - 1), p.flip.slice(0, b - 1)}
          .to(c10::Device(c10::kCPU)),
      s);
  EXPECT_EQ(first_mismatch(gathered[b - 1].unsqueeze(0).cpu(), host, 1e-5), "");
}

TEST(AugmentGpuTest, SamplingFallsBackToTheStagedWindowWhereGathersCannotRead) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  AugmentSpec s;
  s.crop_h = s.crop_w = 20;
  s.out_h = s.out_w = 24;
  // A width no texture pitch alignment divides.
  const at::Tensor odd = random_images(2, 3, 37, 29, 60).to(cuda);
  EXPECT_EQ(resolve_augment_sampling(odd, s, AugmentSampling::kAuto),
            AugmentSampling::kStagedWindow);
  try {
    resolve_augment_sampling(odd, s, AugmentSampling::kTextureGather);
    ADD_FAILURE() << "no error for a width of 29";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("image width 29 is not a texture pitch"),
              std::string::npos)
        << e.what();
  }
  // Two channels: the kernel has no gather variant.
  AugmentSpec two = s;
  two.mean = {0, 0};
  two.std = {1, 1};
  const at::Tensor planes2 = random_images(2, 2, 64, 64, 61).to(cuda);
  EXPECT_EQ(resolve_augment_sampling(planes2, two, AugmentSampling::kAuto),
            AugmentSampling::kStagedWindow);
  EXPECT_THROW(resolve_augment_sampling(planes2, two, AugmentSampling::kTextureGather),
               InvalidArgument);
  // Data off the texture alignment (a view one byte into its storage).
  const at::Tensor shifted = random_images(1, 1, 1, 3 * 64 * 64 + 1, 62)
                                 .to(cuda)
                                 .view({-1})
                                 .slice(0, 1)
                                 .view({1, 3, 64, 64});
  EXPECT_EQ(resolve_augment_sampling(shifted, s, AugmentSampling::kAuto),
            AugmentSampling::kStagedWindow);
  expect_gpu_matches_cpu(s, 2, 3, 37, 29, 63);  // kAuto: staged, still exact
}

TEST(AugmentGpuTest, AnEmptyBatchGivesAnEmptyOutputEitherWay) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const AugmentSpec s;
  const at::Tensor none = random_images(0, 3, 256, 256, 70).to(cuda);
  auto gen = at::cuda::detail::createCUDAGenerator(0);
  const auto p = draw_augment_params(s, 0, 256, 256, cuda, gen);
  for (AugmentSampling sampling :
       {AugmentSampling::kAuto, AugmentSampling::kTextureGather, AugmentSampling::kStagedWindow}) {
    SCOPED_TRACE(to_string(sampling));
    const at::Tensor out = augment(none, p, s, sampling);
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{0, 3, 256, 256}));
  }
}

TEST(AugmentTest, SamplingNamesParseAndBadOnesAreRejected) {
  EXPECT_EQ(parse_augment_sampling("auto"), AugmentSampling::kAuto);
  EXPECT_EQ(parse_augment_sampling("gather"), AugmentSampling::kTextureGather);
  EXPECT_EQ(parse_augment_sampling("staged"), AugmentSampling::kStagedWindow);
  try {
    parse_augment_sampling("texture");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sampling 'texture' is not valid"), std::string::npos);
  }
}

// 40 images of 256x256 are 2,560 tiles: more than the blocks a GPU holds at once (792 on an
// H200), so blocks run in several waves (and a kernel that loops its blocks over tiles, as v9
// did, loops over tiles of different samples).
TEST(AugmentGpuTest, KernelMatchesTheCppReferenceOnMoreTilesThanTheGpuHoldsAtOnce) {
  TANDEM_SKIP_WITHOUT_CUDA();
  AugmentSpec s;
  s.hflip_probability = 0.5;
  expect_gpu_matches_cpu(s, 40, 3, 256, 256, 24);
}

TEST(AugmentGpuTest, KernelMatchesTheCppReferenceOnOddSizesAndABatchOfOne) {
  TANDEM_SKIP_WITHOUT_CUDA();
  AugmentSpec s;
  s.crop_h = 17;
  s.crop_w = 23;
  s.out_h = 45;
  s.out_w = 37;
  s.blur_kernel = 5;
  s.mean = {1, 2};
  s.std = {3, 4};
  expect_gpu_matches_cpu(s, 1, 2, 37, 29, 22);
  expect_gpu_matches_cpu(s, 5, 2, 37, 29, 23);
}

// The column pass gives each (channel, 16-row strip) of a tile a warp: one channel leaves six
// of the eight warps idle there, four use all eight. Output heights 45 and 53 end the last row
// of tiles in its first strip (the second has no rows) and in its second.
TEST(AugmentGpuTest, KernelMatchesTheCppReferenceForOneAndFourChannels) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (int channels : {1, 4})
    for (int out_h : {45, 53}) {
      SCOPED_TRACE(std::to_string(channels) + " channels, output height " + std::to_string(out_h));
      AugmentSpec s;
      s.crop_h = 30;
      s.crop_w = 26;
      s.out_h = out_h;
      s.out_w = 41;
      s.mean.assign(channels, 100.0);
      s.std.assign(channels, 50.0);
      expect_gpu_matches_cpu(s, 3, channels, 48, 40, 70 + channels + out_h);
    }
}

TEST(AugmentGpuTest, KernelMatchesTheCppReferenceForEveryBlurSizePath) {
  TANDEM_SKIP_WITHOUT_CUDA();
  // 1..9 are compiled for their size; 11 and 15 take the run-time-size path.
  for (int taps : {1, 3, 9, 11, 15}) {
    SCOPED_TRACE("blur kernel " + std::to_string(taps));
    AugmentSpec s;
    s.crop_h = s.crop_w = 40;
    s.out_h = 70;
    s.out_w = 66;
    s.blur_kernel = taps;
    s.hflip_probability = 0.5;
    expect_gpu_matches_cpu(s, 3, 3, 64, 64, 30 + taps);
  }
}

TEST(AugmentGpuTest, KernelMatchesTheCppReferenceWhenTheSourceWindowIsTooLargeToStage) {
  TANDEM_SKIP_WITHOUT_CUDA();
  // A 6x downscale: a 32x32 output tile reads a ~200x200 source window, more than the kernel
  // stages in shared memory, so its reads go to global memory.
  AugmentSpec s;
  s.crop_h = s.crop_w = 192;
  s.out_h = s.out_w = 32;
  s.blur_kernel = 3;
  expect_gpu_matches_cpu(s, 2, 3, 256, 256, 40);
}

TEST(AugmentGpuTest, DeviceDrawsAreReproduciblePerSampleAndWithinTheirRanges) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const AugmentSpec s;  // the cls workload's defaults
  const c10::Device cuda(c10::kCUDA, 0);
  auto draw = [&](uint64_t seed) {
    auto gen = at::cuda::detail::createCUDAGenerator(0);
    gen.set_current_seed(seed);
    return std::make_pair(draw_augment_params(s, 4000, 256, 256, cuda, gen).to(c10::kCPU),
                          draw_augment_params(s, 4000, 256, 256, cuda, gen).to(c10::kCPU));
  };
  const auto [a, a_next] = draw(5);
  const auto [b, b_next] = draw(5);
  EXPECT_TRUE(a.angle_deg.equal(b.angle_deg) && a.top.equal(b.top) &&
              a.blur_weights.equal(b.blur_weights) && a_next.sigma.equal(b_next.sigma));
  EXPECT_FALSE(a.angle_deg.equal(a_next.angle_deg));  // the next draw takes a new offset
  EXPECT_EQ(a.top.min().item<int>(), 0);
  EXPECT_EQ(a.top.max().item<int>(), 128);
  EXPECT_EQ(a.left.min().item<int>(), 0);
  EXPECT_EQ(a.left.max().item<int>(), 128);
  EXPECT_GE(a.angle_deg.min().item<float>(), -45.f);
  EXPECT_LE(a.angle_deg.max().item<float>(), 45.f);
  EXPECT_LT(a.angle_deg.min().item<float>(), -44.f);
  EXPECT_GT(a.angle_deg.max().item<float>(), 44.f);
  EXPECT_GE(a.sigma.min().item<float>(), 0.1f);
  EXPECT_LE(a.sigma.max().item<float>(), 2.0f);
  EXPECT_TRUE(at::allclose(a.blur_weights.sum(1), at::ones({4000})));
  EXPECT_TRUE(at::allclose(a.cos_a.pow(2) + a.sin_a.pow(2), at::ones({4000}), 1e-5, 1e-5));
}

}  // namespace
}  // namespace tandem
