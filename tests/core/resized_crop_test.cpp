// Resized crop (RandomResizedCrop / Resize + CenterCrop on packed variable-size batches): the
// geometry against torchvision's rules, the resample against ATen's antialiased bilinear resize,
// the draws' ranges and determinism, and the kernel against the C++ reference, to the bit.
#include "tandem/resized_crop.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/resized_crop_launch.h"
#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace {

struct Packed {
  at::Tensor packed, offsets, sizes;
};

// Images (C, h, w) back to back as (h, w, C), as the loader packs ImageFolder's decoded ones.
// planar: each (C, h, w) as it is, as nvJPEG writes them (sizes still h, w, C).
Packed pack(const std::vector<at::Tensor>& images, bool planar = false) {
  std::vector<at::Tensor> flat;
  std::vector<int64_t> offsets, sizes;
  int64_t at_byte = 0;
  for (const auto& chw : images) {
    const at::Tensor img = planar ? chw.contiguous() : chw.permute({1, 2, 0}).contiguous();
    flat.push_back(img.view(-1));
    offsets.push_back(at_byte);
    for (int d : {1, 2, 0}) sizes.push_back(chw.size(d));
    at_byte += img.numel();
  }
  const int64_t B = static_cast<int64_t>(images.size());
  return {at::cat(flat), at::tensor(offsets, at::kLong), at::tensor(sizes, at::kLong).view({B, 3})};
}

at::Tensor random_image(int64_t c, int64_t h, int64_t w, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, {c, h, w}, g, at::kByte);
}

std::vector<int32_t> row(const at::Tensor& boxes, int64_t i) {
  const at::Tensor r = boxes[i].cpu().contiguous();
  return std::vector<int32_t>(r.data_ptr<int32_t>(), r.data_ptr<int32_t>() + r.numel());
}

at::Tensor box_tensor(std::vector<int32_t> b) {
  b.resize(kCropBoxFields, 0);  // whole pixels unless the test gives the sub-pixel fields
  return at::tensor(b, at::kInt).view({1, kCropBoxFields});
}

ResizedCropSpec plain(int64_t out_h, int64_t out_w) {  // no normalization: pixels out
  ResizedCropSpec s = ResizedCropSpec::train(out_h);
  s.out_w = out_w;
  s.mean = {0, 0, 0};
  s.std = {1, 1, 1};
  return s;
}

// ATen's antialiased bilinear resize of a crop, rounded to pixels as torchvision's uint8 path.
at::Tensor aten_resize(const at::Tensor& chw, int64_t oh, int64_t ow) {
  return at::_upsample_bilinear2d_aa(chw.unsqueeze(0).to(at::kFloat), {oh, ow}, false)
      .squeeze(0)
      .round()
      .clamp(0, 255);
}

TEST(ResizedCropTest, AnImageOfTheOutputSizeWithoutACropIsItsPixelsNormalized) {
  const at::Tensor img = random_image(3, 17, 17, 1);
  const Packed p = pack({img});
  const ResizedCropSpec s = ResizedCropSpec::eval(17, 17);
  const at::Tensor boxes = draw_crop_boxes(s, p.sizes);
  EXPECT_EQ(boxes[0][6].item<int32_t>(), 0);
  EXPECT_EQ(boxes[0][7].item<int32_t>(), 0);
  const at::Tensor out = resized_crop(p.packed, p.offsets, p.sizes, boxes, s);
  at::Tensor expected = img.to(at::kFloat).unsqueeze(0);
  for (int c = 0; c < 3; ++c)
    expected[0][c] = expected[0][c] * static_cast<float>(1.0 / s.std[c]) +
                     static_cast<float>(-s.mean[c] / s.std[c]);
  EXPECT_TRUE(at::allclose(out, expected, 1e-5, 1e-5));
}

TEST(ResizedCropTest, ACropResizedMatchesATensAntialiasedBilinearWithinOneLevel) {
  const at::Tensor img = random_image(3, 120, 90, 2);
  const Packed p = pack({img});
  for (const auto& [oh, ow] :
       std::vector<std::pair<int64_t, int64_t>>{{32, 24}, {96, 64}, {150, 140}}) {
    // top 10, left 5, 100 x 80 crop resized to oh x ow, no flip.
    const at::Tensor boxes =
        box_tensor({10, 5, 100, 80, static_cast<int32_t>(oh), static_cast<int32_t>(ow), 0, 0, 0});
    const at::Tensor out = resized_crop(p.packed, p.offsets, p.sizes, boxes, plain(oh, ow));
    const at::Tensor ref = aten_resize(img.narrow(1, 10, 100).narrow(2, 5, 80), oh, ow);
    EXPECT_LE((out[0] - ref).abs().max().item<float>(), 1.0f) << oh << "x" << ow;
    EXPECT_LT((out[0] - ref).abs().mean().item<float>(), 0.05f) << oh << "x" << ow;
  }
}

TEST(ResizedCropTest, EvaluationIsResizeOfTheShortSideThenACenterCrop) {
  const at::Tensor img = random_image(3, 48, 64, 3);  // resize 32: 32 x 42, crop 28: (2, 7)
  const Packed p = pack({img});
  ResizedCropSpec s = ResizedCropSpec::eval(28, 32);
  s.mean = {0, 0, 0};
  s.std = {1, 1, 1};
  const at::Tensor boxes = draw_crop_boxes(s, p.sizes);
  EXPECT_EQ(row(boxes, 0), (std::vector<int32_t>{0, 0, 48, 64, 32, 42, 2, 7, 0, 0, 0}));
  const at::Tensor out = resized_crop(p.packed, p.offsets, p.sizes, boxes, s);
  const at::Tensor ref = aten_resize(img, 32, 42).narrow(1, 2, 28).narrow(2, 7, 28);
  EXPECT_LE((out[0] - ref).abs().max().item<float>(), 1.0f);
}

TEST(ResizedCropTest, TheFlipMirrorsTheOutputExactly) {
  const at::Tensor img = random_image(3, 40, 50, 4);
  const Packed p = pack({img});
  const ResizedCropSpec s = plain(20, 30);
  const at::Tensor a =
      resized_crop(p.packed, p.offsets, p.sizes, box_tensor({3, 4, 30, 40, 20, 30, 0, 0, 0}), s);
  const at::Tensor b =
      resized_crop(p.packed, p.offsets, p.sizes, box_tensor({3, 4, 30, 40, 20, 30, 0, 0, 1}), s);
  EXPECT_TRUE(at::equal(a.flip({3}), b));
}

TEST(ResizedCropTest, PlanarSamplesGiveTheSameOutputAsInterleavedOnes) {
  const std::vector<at::Tensor> imgs{random_image(3, 40, 50, 7), random_image(3, 90, 31, 8)};
  const Packed hwc = pack(imgs), chw = pack(imgs, /*planar=*/true);
  ResizedCropSpec s = ResizedCropSpec::train(24);
  const at::Tensor boxes = draw_crop_boxes(s, hwc.sizes);
  const at::Tensor a = resized_crop(hwc.packed, hwc.offsets, hwc.sizes, boxes, s);
  s.planar = true;
  EXPECT_TRUE(at::equal(a, resized_crop(chw.packed, chw.offsets, chw.sizes, boxes, s)));
}

TEST(ResizedCropTest, RandomBoxesFollowTorchvisionsRanges) {
  std::vector<at::Tensor> imgs;
  for (int i = 0; i < 400; ++i)
    imgs.push_back(at::zeros({3, 40 + i % 200, 60 + (7 * i) % 300}, at::kByte));
  const Packed p = pack(imgs);
  const ResizedCropSpec s = ResizedCropSpec::train(224);
  at::Generator g = at::detail::createCPUGenerator(5);
  const at::Tensor boxes = draw_crop_boxes(s, p.sizes, g);
  int flips = 0;
  for (int i = 0; i < 400; ++i) {
    const std::vector<int32_t> v = row(boxes, i);
    const int64_t h = p.sizes[i][0].item<int64_t>(), w = p.sizes[i][1].item<int64_t>();
    ASSERT_GE(v[0], 0);
    ASSERT_GE(v[1], 0);
    ASSERT_LE(v[0] + v[2], h);
    ASSERT_LE(v[1] + v[3], w);
    const double area = static_cast<double>(v[2]) * v[3] / (static_cast<double>(h) * w);
    const double ratio = static_cast<double>(v[3]) / v[2];
    // Rounding the sides to pixels moves area and ratio a little past the drawn ranges.
    EXPECT_GE(area, 0.08 * 0.8) << i;
    EXPECT_GE(ratio, 0.75 * 0.9) << i;
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.1) << i;
    EXPECT_EQ(v[4], 224);
    EXPECT_EQ(v[5], 224);
    flips += v[8];
  }
  EXPECT_GT(flips, 150);
  EXPECT_LT(flips, 250);
  at::Generator g2 = at::detail::createCPUGenerator(5), g3 = at::detail::createCPUGenerator(6);
  EXPECT_TRUE(at::equal(boxes, draw_crop_boxes(s, p.sizes, g2)));
  EXPECT_FALSE(at::equal(boxes, draw_crop_boxes(s, p.sizes, g3)));
}

TEST(ResizedCropTest, AnImageTooNarrowForTheRatioRangeFallsBackToTheClampedWholeImage) {
  const Packed p = pack({at::zeros({3, 4, 100}, at::kByte)});  // ratio 25: no try can fit
  const at::Tensor boxes = draw_crop_boxes(ResizedCropSpec::train(8), p.sizes);
  // torchvision: h = 4, w = round(4 * 4/3) = 5, centred: left = (100 - 5) / 2 = 47.
  const std::vector<int32_t> v = row(boxes, 0);
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 4), (std::vector<int32_t>{0, 47, 4, 5}));
}

TEST(ResizedCropTest, ASampleWithAnotherChannelCountComesOutAsNan) {
  const Packed p = pack({random_image(3, 8, 8, 1), random_image(1, 8, 8, 2)});
  const ResizedCropSpec s = ResizedCropSpec::eval(8, 8);
  const at::Tensor out = resized_crop(p.packed, p.offsets, p.sizes, draw_crop_boxes(s, p.sizes), s);
  EXPECT_FALSE(out[0].isnan().any().item<bool>());
  EXPECT_TRUE(out[1].isnan().all().item<bool>());
}

TEST(ResizedCropTest, RejectsBadInputNamingTheValue) {
  const Packed p = pack({random_image(3, 8, 8, 1)});
  auto message = [&](auto fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ResizedCropSpec s = ResizedCropSpec::train(8);
  s.scale_min = 0;
  EXPECT_NE(message([&] { draw_crop_boxes(s, p.sizes); }).find("scale range"), std::string::npos);
  s = ResizedCropSpec::eval(224, 200);
  EXPECT_NE(message([&] { draw_crop_boxes(s, p.sizes); }).find("resize size 200"),
            std::string::npos);
  s = ResizedCropSpec::train(8);
  s.mean = {0};
  EXPECT_NE(message([&] { draw_crop_boxes(s, p.sizes); }).find("std has 3 values for 1 channels"),
            std::string::npos);
  s = ResizedCropSpec::train(8);
  EXPECT_NE(message([&] { draw_crop_boxes(s, p.sizes.to(at::kInt)); }).find("(B, 3) int64"),
            std::string::npos);
  const at::Tensor boxes = draw_crop_boxes(s, p.sizes);
  EXPECT_NE(message([&] {
              resized_crop(p.packed.narrow(0, 0, 100), p.offsets, p.sizes, boxes, s);
            }).find("outside the 100 packed bytes"),
            std::string::npos);
  EXPECT_NE(message([&] {
              resized_crop(p.packed, p.offsets, p.sizes, boxes.narrow(1, 0, 8), s);
            }).find("boxes must be"),
            std::string::npos);
}

TEST(ResizedCropTest, PlaceCropBoxRoundsToEighthsAndStaysInsideTheRegion) {
  std::vector<int32_t> b(kCropBoxFields, 7);  // other fields stay
  place_crop_box(b.data(), 2.5, 0.0, 10.25, 7.0, 13, 7);
  EXPECT_EQ(b, (std::vector<int32_t>{2, 0, 10, 7, 7, 7, 7, 7, 7, 4 + 8 * 2, 0}));
  place_crop_box(b.data(), 2.5, 1.0, 10.6, 7.0, 13, 7);  // would end past row 13 and column 7
  EXPECT_EQ(b, (std::vector<int32_t>{2, 1, 10, 6, 7, 7, 7, 7, 7, 4 + 8 * 4, 0}));
  place_crop_box(b.data(), 3.0, 1.0, 4.0, 2.0, 13, 7);  // whole pixels: no eighths
  EXPECT_EQ(b, (std::vector<int32_t>{3, 1, 4, 2, 7, 7, 7, 7, 7, 0, 0}));
}

// A batch of photos of assorted sizes (some much larger than the output, some smaller).
Packed assorted_batch(int n, uint64_t seed, bool planar = false) {
  std::vector<at::Tensor> imgs;
  for (int i = 0; i < n; ++i)
    imgs.push_back(random_image(3, 30 + (37 * i) % 500, 20 + (53 * i) % 600, seed + i));
  return pack(imgs, planar);
}

TEST(ResizedCropTest, ChannelsLastIsTheSameValuesLaidOutChannelsLast) {
  const Packed p = assorted_batch(6, 3);
  ResizedCropSpec planes = ResizedCropSpec::train(48), last = planes;
  last.channels_last = true;
  const at::Tensor boxes = draw_crop_boxes(planes, p.sizes);
  const at::Tensor a = resized_crop(p.packed, p.offsets, p.sizes, boxes, planes);
  const at::Tensor b = resized_crop(p.packed, p.offsets, p.sizes, boxes, last);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_TRUE(b.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(b.sizes(), a.sizes());
  EXPECT_TRUE(at::equal(a, b));
}

// The kernel's all-channels resample (each tap's weights once for every channel) is the
// per-channel one, bit for bit: shrinking, enlarging and sub-pixel windows, both layouts, 1 to 4
// channels.
TEST(ResizedCropTest, AllChannelsAtOnceIsEachChannelsResampleToTheBit) {
  namespace cm = crop_math;
  at::manual_seed(9);
  const int h = 37, w = 53;
  int64_t compared = 0;
  for (const int C : {1, 3, 4})
    for (const bool planar : {false, true}) {
      const at::Tensor image = at::randint(0, 256, {h * w * C}, at::kByte);
      const uint8_t* src = image.const_data_ptr<uint8_t>();
      const cm::Layout layout = cm::layout_of(planar, h, w, C);
      // (source length, resized length, sub-pixel field) per axis: shrink, enlarge, equal.
      struct Axis {
        int in, out, sub;
      };
      for (const Axis ay : {Axis{30, 7, 0}, Axis{12, 29, 0}, Axis{20, 20, 3 + 8}})
        for (const Axis ax : {Axis{45, 11, 5 + 16}, Axis{9, 31, 0}})
          for (int y = 0; y < ay.out; y += 3)
            for (int x = 0; x < ax.out; x += 2) {
              const cm::AxisWindow rows = cm::axis_window(y, ay.in, ay.out, ay.sub),
                                   cols = cm::axis_window(x, ax.in, ax.out, ax.sub);
              float all[kCropMaxChannels];
              cm::resample_channels<kCropMaxChannels>(src, layout, C, 2, 1, rows, cols, all);
              for (int c = 0; c < C; ++c) {
                const float one = cm::resample(src, layout, c, 2, 1, rows, cols);
                ASSERT_EQ(std::memcmp(&one, &all[c], sizeof(float)), 0)
                    << "channel " << c << " of " << C << (planar ? " planar" : "") << " at (" << y
                    << ", " << x << "): " << one << " against " << all[c];
                ++compared;
              }
            }
    }
  EXPECT_GT(compared, 0);
}

TEST(ResizedCropGpuTest, KernelMatchesTheCppReferenceToTheBit) {
  TANDEM_SKIP_WITHOUT_CUDA();
  ResizedCropSpec planar = ResizedCropSpec::train(96);
  planar.planar = true;
  ResizedCropSpec channels_last = ResizedCropSpec::train(224), planar_channels_last = planar;
  channels_last.channels_last = planar_channels_last.channels_last = true;
  for (const ResizedCropSpec& s :
       {ResizedCropSpec::train(224), ResizedCropSpec::eval(224, 256), ResizedCropSpec::train(64),
        planar, channels_last, planar_channels_last}) {
    const Packed p = assorted_batch(24, 10, s.planar);
    const at::Tensor sizes = p.sizes.cuda();
    const at::Tensor boxes = draw_crop_boxes(s, sizes);
    const at::Tensor on_gpu = resized_crop(p.packed.cuda(), p.offsets.cuda(), sizes, boxes, s);
    const at::Tensor gpu = on_gpu.cpu();
    const at::Tensor cpu = resized_crop(p.packed, p.offsets, p.sizes, boxes.cpu(), s);
    EXPECT_TRUE(at::equal(gpu, cpu)) << "max diff " << (gpu - cpu).abs().max().item<float>()
                                     << " random " << s.random << " out " << s.out_h;
    EXPECT_EQ(on_gpu.is_contiguous(at::MemoryFormat::ChannelsLast), s.channels_last)
        << "the kernel writes the layout asked for";
  }
}

// Boxes with sub-pixel starts and lengths (a box cut from a DCT-scaled decode): each drawn box
// loses its last row and column and gets back up to one pixel in eighths, so its taps stay
// inside the image.
TEST(ResizedCropGpuTest, SubPixelBoxesMatchTheCppReferenceToTheBit) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const ResizedCropSpec& s : {ResizedCropSpec::train(224), ResizedCropSpec::train(64)}) {
    const Packed p = assorted_batch(24, 30);
    at::Tensor boxes = draw_crop_boxes(s, p.sizes).contiguous();
    int32_t* b = boxes.data_ptr<int32_t>();
    for (int i = 0; i < 24; ++i) {
      int32_t* r = b + i * kCropBoxFields;
      const int start_y = (i * 3) % 8, start_x = (i * 5 + 1) % 8;
      const int extra_y = std::max(0, 8 - start_y - i % 3),
                extra_x = std::max(0, 8 - start_x - i % 2);
      if (r[2] > 1) {
        r[2] -= 1;
        r[9] = start_y + 8 * extra_y;
      }
      if (r[3] > 1) {
        r[3] -= 1;
        r[10] = start_x + 8 * extra_x;
      }
    }
    const at::Tensor gpu =
        resized_crop(p.packed.cuda(), p.offsets.cuda(), p.sizes.cuda(), boxes.cuda(), s).cpu();
    const at::Tensor cpu = resized_crop(p.packed, p.offsets, p.sizes, boxes, s);
    EXPECT_TRUE(at::equal(gpu, cpu))
        << "max diff " << (gpu - cpu).abs().max().item<float>() << " out " << s.out_h;
    EXPECT_FALSE(at::isnan(cpu).any().item<bool>());
  }
}

TEST(ResizedCropGpuTest, DeviceDrawsAreReproducibleForASeedAndWithinTheImage) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const Packed p = assorted_batch(64, 20);
  const at::Tensor sizes = p.sizes.cuda();
  const ResizedCropSpec s = ResizedCropSpec::train(224);
  at::Generator a = at::cuda::detail::createCUDAGenerator(0),
                b = at::cuda::detail::createCUDAGenerator(0);
  a.set_current_seed(7);
  b.set_current_seed(7);
  const at::Tensor ba = draw_crop_boxes(s, sizes, a).cpu(), bb = draw_crop_boxes(s, sizes, b).cpu();
  EXPECT_TRUE(at::equal(ba, bb));
  EXPECT_FALSE(at::equal(ba, draw_crop_boxes(s, sizes, a).cpu())) << "the next draw differs";
  for (int i = 0; i < 64; ++i) {
    EXPECT_LE(ba[i][0].item<int32_t>() + ba[i][2].item<int32_t>(), p.sizes[i][0].item<int64_t>());
    EXPECT_LE(ba[i][1].item<int32_t>() + ba[i][3].item<int32_t>(), p.sizes[i][1].item<int64_t>());
  }
}

}  // namespace
}  // namespace tandem
