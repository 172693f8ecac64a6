// decode_image_region: the crop a training sample needs, decoded at the smallest DCT scale at
// which the crop (not the whole image) keeps the output size, against torchvision's way — the
// full-resolution decode, the box cut from it, resized to 224 — and against a whole-image scaled
// decode with the box cut afterwards (which enlarges a small box of a large photo). The PSNRs
// are printed (and stated in docs/notes/cpu-decode.md); the test holds the region decode to
// >= 30 dB everywhere and well above the whole-image decode where that one enlarges.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fixtures.h"
#include "tandem/data/decode.h"
#include "tandem/data/engine_share.h"
#include "tandem/data/engine_split.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/resize.h"
#include "tandem/data/shrink.h"
#include "tandem/error.h"
#include "tandem/resized_crop.h"

namespace tandem::data {
namespace {

// A 1600 x 1200 "photo" with detail at several scales (periods from 3.7 to 90 px, edges, a
// little noise), as a quality-95 4:2:0 JPEG: what a phone photo is to a decoder.
std::vector<uint8_t> detailed_photo(int64_t h = 1200, int64_t w = 1600) {
  torch::manual_seed(5);
  const auto y = torch::arange(h, torch::kFloat).view({h, 1});
  const auto x = torch::arange(w, torch::kFloat).view({1, w});
  const double tau = 2 * M_PI;
  std::vector<at::Tensor> planes;
  for (int c = 0; c < 3; ++c) {
    at::Tensor p = 128 + 50 * torch::sin(tau * x / (90.0 + 10 * c)) * torch::cos(tau * y / 70.0) +
                   30 * torch::sin(tau * (x + 2 * y) / (9.0 + c)) +
                   20 * torch::sin(tau * (x - y) / 3.7) +
                   40 * ((torch::floor(x / 150) + torch::floor(y / 110)).remainder(2) - 0.5) +
                   6 * torch::randn({h, w});
    planes.push_back(p.clamp(0, 255));
  }
  return encode_jpeg(torch::stack(planes).round().to(torch::kByte), 95);
}

// The C++ reference resample (the GPU kernel's twin): `hwc` cut at the box — whole pixels, or
// with sub-pixel parts in eighths (kSubY / kSubX) —, resized to 224 x 224 with antialiased
// bilinear, in pixel units (no normalization).
at::Tensor resize_box(const at::Tensor& hwc, double top, double left, double height, double width) {
  ResizedCropSpec spec = ResizedCropSpec::train(224);
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  auto eighths = [](double v) { return static_cast<int32_t>(std::lround(v * 8)); };
  const int32_t t8 = eighths(top), l8 = eighths(left), h8 = eighths(height), w8 = eighths(width);
  const at::Tensor sizes = torch::tensor({hwc.size(0), hwc.size(1), hwc.size(2)}).view({1, 3});
  const at::Tensor boxes = torch::tensor({t8 / 8, l8 / 8, h8 / 8, w8 / 8, 224, 224, 0, 0, 0,
                                          (t8 % 8) + 8 * (h8 % 8), (l8 % 8) + 8 * (w8 % 8)},
                                         torch::kInt)
                               .view({1, kCropBoxFields});
  return resized_crop(hwc.contiguous().view(-1), torch::zeros({1}, torch::kLong), sizes, boxes,
                      spec);
}

double psnr(const at::Tensor& a, const at::Tensor& b) {
  const double mse = (a - b).square().mean().item<double>();
  return 10 * std::log10(255.0 * 255.0 / std::max(mse, 1e-12));
}

TEST(CropDecodeTest, ARegionDecodeKeepsTheCropsResolution) {
  const std::vector<uint8_t> jpeg = detailed_photo();
  const at::Tensor full = decode_image_interleaved(jpeg, "photo.jpg", 3);  // accurate, 1200 x 1600
  const at::Tensor whole_scaled = decode_image_interleaved(jpeg, "photo.jpg", 3, 224, 224);
  ASSERT_EQ(whole_scaled.size(0), 300);  // 1/4: the whole image's scale for 224
  struct Case {
    PixelBox box;
    int denom;  // the scale the box allows
  };
  // RandomResizedCrop's range: 0.08 of the area (the smallest box) to the whole image.
  // Boxes on the scale's grid and off it (edges inside a decoded pixel: the resample takes the
  // box's eighths).
  for (const Case& k :
       {Case{{200, 300, 390, 350}, 1}, Case{{16, 28, 500, 450}, 2}, Case{{13, 27, 500, 450}, 2},
        Case{{334, 512, 800, 700}, 2}, Case{{333, 511, 801, 699}, 2}, Case{{0, 0, 1200, 1600}, 4},
        Case{{701, 1201, 461, 399}, 1}, Case{{200, 560, 960, 1024}, 4},
        Case{{201, 563, 959, 1023}, 4}}) {
    const PixelBox& b = k.box;
    SCOPED_TRACE(std::to_string(b.height) + " x " + std::to_string(b.width));
    const at::Tensor reference = resize_box(full, b.top, b.left, b.height, b.width);

    const DecodedRegion r = decode_image_region(jpeg, "photo.jpg", 3, b, 224, 224);
    EXPECT_EQ(r.scale_denom, k.denom);
    EXPECT_GE(r.height, 224);
    EXPECT_GE(r.width, 224);
    const double region_psnr =
        psnr(resize_box(r.image, r.top, r.left, r.height, r.width), reference);

    const double s = 0.25;  // the box in the whole-image decode
    const double whole_psnr =
        psnr(resize_box(whole_scaled, std::lround(b.top * s), std::lround(b.left * s),
                        std::min<int64_t>(std::lround(b.height * s), 300 - std::lround(b.top * s)),
                        std::min<int64_t>(std::lround(b.width * s), 400 - std::lround(b.left * s))),
             reference);
    std::printf(
        "box %4lld x %4lld at (%4lld, %4lld): region decode 1/%d, %.1f dB; whole-image "
        "decode 1/4, %.1f dB\n",
        static_cast<long long>(b.height), static_cast<long long>(b.width),
        static_cast<long long>(b.top), static_cast<long long>(b.left), r.scale_denom, region_psnr,
        whole_psnr);
    EXPECT_GE(region_psnr, 30.0);
    // Where the whole-image decode had to enlarge the box (it is under 224 there), the region
    // decode is far closer to torchvision's crop.
    if (b.height * s < 224 || b.width * s < 224) {
      EXPECT_GE(region_psnr, whole_psnr + 3.0);
    }
  }
}

TEST(CropDecodeTest, APngRegionIsTheCutOfItsFullDecode) {
  const at::Tensor chw = torch::randint(0, 256, {3, 40, 50}, torch::kByte);
  const std::vector<uint8_t> png = encode_png(chw);
  const DecodedRegion r = decode_image_region(png, "a.png", 3, {5, 7, 20, 30}, 10, 10);
  EXPECT_EQ(r.scale_denom, 1);
  EXPECT_TRUE(at::equal(r.image, chw.permute({1, 2, 0}).slice(0, 5, 25).slice(1, 7, 37)));
  EXPECT_EQ(r.top, 0);
  EXPECT_EQ(r.height, 20);
}

TEST(CropDecodeTest, ABoxOutsideTheImageIsNamed) {
  const std::vector<uint8_t> jpeg = encode_jpeg(torch::full({3, 64, 48}, 100, torch::kByte), 90);
  for (const PixelBox& b : {PixelBox{0, 0, 65, 10}, PixelBox{60, 0, 5, 10}, PixelBox{0, 40, 10, 9},
                            PixelBox{0, 0, 0, 10}, PixelBox{-1, 0, 10, 10}}) {
    try {
      decode_image_region(jpeg, "small.jpg", 3, b, 8, 8);
      ADD_FAILURE() << "no error for a box outside the image";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is not inside small.jpg (64 x 48)"), std::string::npos)
          << e.what();
    }
  }
}

// A damaged file fails naming it, as a whole-image decode does: cut inside the box's rows, and
// with its entropy-coded data overwritten.
TEST(CropDecodeTest, ADamagedJpegIsNamed) {
  const std::vector<uint8_t> jpeg = detailed_photo(480, 640);
  const PixelBox box{300, 100, 150, 300};  // decoded at 1/1: the rows 300..450
  std::vector<uint8_t> cut(jpeg.begin(),
                           jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2));
  std::vector<uint8_t> noise = jpeg;
  for (size_t i = noise.size() / 3; i < noise.size() - 2; i += 7)
    noise[i] = static_cast<uint8_t>(i * 31);
  for (const auto* bytes : {&cut, &noise}) {
    try {
      decode_image_region(*bytes, "broken.jpg", 3, box, 100, 100);
      ADD_FAILURE() << "no error for a damaged JPEG";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("broken.jpg"), std::string::npos) << e.what();
    }
  }
}

// ImageFolderOutput::kCropRegion: a sample is the crop its draw key picks, decoded as a region;
// resized with its box it is torchvision's crop of the full-resolution image (the same box from
// draw_crop_box) within the region decode's fidelity, and the same key gives the same sample.
TEST(CropDecodeTest, ACropRegionSampleIsTheDrawnCropOfTheFullImage) {
  const std::vector<uint8_t> jpeg = detailed_photo();
  const testing::TempDir dir;
  testing::put(dir, "root/photos/p.jpg", jpeg);
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCropRegion;
  const ImageFolderDataset folder(dir.file("root"), fo);
  ASSERT_EQ(folder.fields().size(), 3u);
  EXPECT_EQ(folder.fields()[1].name, "crop_box");

  const at::Tensor full = decode_image_interleaved(jpeg, "p.jpg", 3);
  ResizedCropSpec spec = ResizedCropSpec::train(224);
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  auto crop = [&](const at::Tensor& hwc, const at::Tensor& box) {
    const at::Tensor sizes = torch::tensor({hwc.size(0), hwc.size(1), hwc.size(2)}).view({1, 3});
    return resized_crop(hwc.contiguous().view(-1), torch::zeros({1}, torch::kLong), sizes,
                        box.view({1, kCropBoxFields}), spec);
  };
  auto sample = [&](const SampleDraw& draw) {
    std::vector<at::Tensor> out{at::Tensor(), torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(0, draw, out);
    return out;
  };
  int64_t smaller = 0;
  for (uint64_t position = 0; position < 12; ++position) {
    const SampleDraw draw{9, position};
    const std::vector<at::Tensor> s = sample(draw);
    at::Tensor full_box = torch::empty({kCropBoxFields}, torch::kInt);
    draw_crop_box(ResizedCropSpec::train(224), 1200, 1600, draw, full_box.data_ptr<int32_t>());
    SCOPED_TRACE("position " + std::to_string(position) + ": box " +
                 std::to_string(full_box[2].item<int>()) + " x " +
                 std::to_string(full_box[3].item<int>()));
    EXPECT_EQ(s[1][8].item<int>(), full_box[8].item<int>());  // the flip
    EXPECT_GE(psnr(crop(s[0], s[1]), crop(full, full_box)), 30.0);
    EXPECT_TRUE(torch::equal(sample(draw)[0], s[0]));
    EXPECT_TRUE(torch::equal(sample(draw)[1], s[1]));
    if (s[0].numel() < full.numel() / 4) ++smaller;
  }
  EXPECT_GE(smaller, 6) << "most crops decode a fraction of the photo's pixels";
  EXPECT_FALSE(torch::equal(sample({10, 0})[1], sample({9, 0})[1])) << "another seed, another box";
}

// ImageFolderOutput::kCenterRegion: an evaluation sample is Resize(256) + CenterCrop(224)'s
// crop with a margin, decoded as a region at Resize's scale; resized by its box it is the
// center crop of the whole image resized (torchvision's evaluation transform of the
// full-resolution decode) as closely as the whole-image scaled decode is, from a fraction of its
// pixels. A PNG (decoded at full size) gives the full-resolution transform itself.
TEST(CropDecodeTest, ACenterRegionSampleIsTheCenterCropOfTheWholeResizedImage) {
  const testing::TempDir dir;
  struct Photo {
    std::string name;
    std::vector<uint8_t> bytes;
  };
  const std::vector<Photo> photos{
      {"a_landscape.jpg", detailed_photo(1200, 1600)},
      {"b_portrait.jpg", detailed_photo(1503, 1001)},
      {"c_square.jpg", detailed_photo(700, 700)},
      {"d_small.png", encode_png(testing::smooth_image(3, 301, 457, 2))}};
  for (const Photo& p : photos) testing::put(dir, "root/photos/" + p.name, p.bytes);
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCenterRegion;
  const ImageFolderDataset center(dir.file("root"), fo);
  ASSERT_EQ(center.fields().size(), 3u);
  EXPECT_EQ(center.fields()[1].name, "crop_box");
  EXPECT_EQ(center.resize_size(), 256);
  const ImageFolderDataset whole =
      center.with_output(ImageFolderOutput::kDecoded).with_image_size(256);

  ResizedCropSpec spec = ResizedCropSpec::eval(224, 256);
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  auto crop = [&](const at::Tensor& hwc, const at::Tensor& box) {
    const at::Tensor sizes = torch::tensor({hwc.size(0), hwc.size(1), hwc.size(2)}).view({1, 3});
    return resized_crop(
        hwc.contiguous().view(-1), torch::zeros({1}, torch::kLong), sizes,
        box.defined() ? box.view({1, kCropBoxFields}) : draw_crop_boxes(spec, sizes), spec);
  };
  for (int64_t i = 0; i < center.size(); ++i) {
    const Photo& p = photos[static_cast<size_t>(i)];
    SCOPED_TRACE(p.name);
    std::vector<at::Tensor> c{at::Tensor(), torch::empty({kCropBoxFields}, torch::kInt),
                              torch::empty({}, torch::kLong)};
    center.get_sample(i, c);
    std::vector<at::Tensor> w{at::Tensor(), torch::empty({}, torch::kLong)};
    whole.get_sample(i, w);
    const at::Tensor full = decode_image_interleaved(p.bytes, p.name, 3);
    const at::Tensor reference = crop(full, at::Tensor());  // Resize + CenterCrop, full size
    const double region_db = psnr(crop(c[0], c[1]), reference);
    const double whole_db = psnr(crop(w[0], at::Tensor()), reference);
    std::printf(
        "%s: center region %lld x %lld (whole scaled decode %lld x %lld): %.1f dB, whole "
        "image %.1f dB against the full-resolution transform\n",
        p.name.c_str(), static_cast<long long>(c[0].size(0)), static_cast<long long>(c[0].size(1)),
        static_cast<long long>(w[0].size(0)), static_cast<long long>(w[0].size(1)), region_db,
        whole_db);
    if (p.name.find(".png") != std::string::npos) {
      EXPECT_GE(region_db, 50.0);  // the same pixels; only the box's eighths differ
      EXPECT_EQ(c[0].size(0), 269) << "the short side's crop and margins: 228 of 256 rows";
    } else {
      EXPECT_GE(region_db, 30.0);
      EXPECT_GE(region_db, whole_db - 0.5) << "as faithful as the whole image at Resize's scale";
      EXPECT_LE(c[0].numel(), w[0].numel() * 9 / 10) << "the pixels outside the crop not decoded";
    }
    EXPECT_EQ(c[1][8].item<int>(), 0) << "no flip";
    std::vector<at::Tensor> again{at::Tensor(), torch::empty({kCropBoxFields}, torch::kInt),
                                  torch::empty({}, torch::kLong)};
    center.get_drawn_sample(i, SampleDraw{17, 99}, again);
    EXPECT_TRUE(torch::equal(again[0], c[0])) << "the center crop draws nothing";
    EXPECT_TRUE(torch::equal(again[1], c[1]));
  }
  EXPECT_THROW(center.with_resize_size(200), InvalidArgument);
  fo.resize_size = 100;
  EXPECT_THROW(ImageFolderDataset(dir.file("root"), fo), InvalidArgument);
}

TEST(CropDecodeTest, TheEnginesShareIsAnEvenSplitOfPositions) {
  for (const double share : {0.0, 0.25, 0.4, 1.0}) {
    int64_t engines = 0, run = 0, longest_cpu_run = 0;
    for (uint64_t p = 0; p < 1024; ++p) {
      const bool e = decodes_on_engines(share, p);
      engines += e;
      run = e ? 0 : run + 1;
      longest_cpu_run = std::max(longest_cpu_run, run);
    }
    EXPECT_EQ(engines, std::llround(share * 1024)) << share;
    if (share >= 0.25) {
      EXPECT_LE(longest_cpu_run, 3) << share;  // spread, not in one block
    }
  }
  for (uint64_t p = 0; p < 64; ++p)  // the pattern repeats every 1024 positions
    EXPECT_EQ(decodes_on_engines(0.4, p), decodes_on_engines(0.4, p + 5 * 1024)) << p;
}

// Training crops split by their cost to the CPU: each block of positions gives the engines as
// many as the even split would, the ones whose boxes reach furthest down the image (a region
// decode reads every row above its box), so the workers keep the cheap ones. Pure: asked again,
// or by another worker, a position takes the same side.
TEST(CropDecodeTest, TheEnginesTakeTheCropsThatCostTheCpuMost) {
  const ResizedCropSpec spec = ResizedCropSpec::train(224);
  const auto cost = [&](uint64_t p) { return crop_region_cpu_cost(spec, SampleDraw{5, p}); };
  for (const double share : {0.0, 0.25, 0.4, 0.5, 1.0}) {
    double engine_bottoms = 0, cpu_bottoms = 0;
    int64_t total = 0;
    for (uint64_t first = 0; first < 1024; first += kEngineBlock) {
      int64_t engines = 0, spread = 0;
      double least_engine_cost = 2, most_cpu_cost = -1;
      for (uint64_t p = first; p < first + kEngineBlock; ++p) {
        const bool e = engines_take_costliest(share, p, cost);
        EXPECT_EQ(e, engines_take_costliest(share, p, cost)) << p;
        engines += e;
        spread += decodes_on_engines(share, p);
        if (e)
          least_engine_cost = std::min(least_engine_cost, cost(p));
        else
          most_cpu_cost = std::max(most_cpu_cost, cost(p));
        // The sample's own box, drawn for a landscape photo's size, as a worker draws it.
        int32_t box[kCropBoxFields];
        draw_crop_box(spec, 1200, 1600, SampleDraw{5, p}, box);
        (e ? engine_bottoms : cpu_bottoms) += static_cast<double>(box[0] + box[2]) / 1200;
      }
      EXPECT_EQ(engines, spread) << "share " << share << ", block at " << first;
      if (engines > 0 && engines < static_cast<int64_t>(kEngineBlock)) {
        EXPECT_GE(least_engine_cost, most_cpu_cost) << "share " << share << ", block at " << first;
      }
      total += engines;
    }
    EXPECT_EQ(total, std::llround(share * 1024)) << share;
    if (total > 0 && total < 1024) {  // the workers' boxes end higher up their photos
      EXPECT_LT(cpu_bottoms / static_cast<double>(1024 - total) + 0.05,
                engine_bottoms / static_cast<double>(total))
          << share;
    }
  }
  for (uint64_t p = 0; p < 1024; ++p) {
    const double c = cost(p);
    EXPECT_GT(c, 0) << p;
    EXPECT_LE(c, 1) << p;
  }
}

// With an engine share, the samples at the engines' positions carry the file's bytes and their
// box in the full-resolution pixels (what the engines decode), the others a decoded region and
// no bytes; a PNG at an engine position is decoded here.
TEST(CropDecodeTest, AnEngineShareLeavesItsSamplesEncodedWithFullResolutionBoxes) {
  const std::vector<uint8_t> jpeg = detailed_photo();
  const testing::TempDir dir;
  testing::put(dir, "root/photos/p.jpg", jpeg);
  testing::put(dir, "root/photos/q.png", encode_png(testing::smooth_image(3, 300, 400, 1)));
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCropRegion;
  fo.engine_share = 0.5;
  const ImageFolderDataset folder(dir.file("root"), fo);
  ASSERT_EQ(folder.fields().size(), 4u);
  EXPECT_EQ(folder.fields()[1].name, "jpeg");
  EXPECT_TRUE(folder.fields()[1].stays_on_host);
  const ImageFolderDataset plain = folder.with_engine_share(0);
  int engines = 0, expected_engines = 0;
  const auto cost = [](uint64_t p) {
    return crop_region_cpu_cost(ResizedCropSpec::train(224), SampleDraw{5, p});
  };
  for (uint64_t position = 0; position < 8; ++position) {
    const SampleDraw draw{5, position};
    std::vector<at::Tensor> out{at::Tensor(), at::Tensor(),
                                torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(0, draw, out);  // p.jpg
    std::vector<at::Tensor> cpu{at::Tensor(), torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    plain.get_drawn_sample(0, draw, cpu);
    const bool on_engines = engines_take_costliest(0.5, position, cost);
    expected_engines += on_engines ? 1 : 0;
    EXPECT_EQ(out[1].numel() > 0, on_engines) << "position " << position;
    if (out[1].numel() > 0) {
      ++engines;
      ASSERT_EQ(out[1].numel(), static_cast<int64_t>(jpeg.size()));
      EXPECT_EQ(std::memcmp(out[1].data_ptr<uint8_t>(), jpeg.data(), jpeg.size()), 0);
      EXPECT_EQ(out[0].numel(), 0);
      at::Tensor full_box = torch::empty({kCropBoxFields}, torch::kInt);
      draw_crop_box(ResizedCropSpec::train(224), 1200, 1600, draw, full_box.data_ptr<int32_t>());
      EXPECT_TRUE(torch::equal(out[2], full_box)) << "position " << position;
    } else {
      EXPECT_EQ(out[1].numel(), 0);
      EXPECT_TRUE(torch::equal(out[0], cpu[0])) << "position " << position;
      EXPECT_TRUE(torch::equal(out[2], cpu[1])) << "position " << position;
    }
    EXPECT_EQ(out[3].item<int64_t>(), 0);
    std::vector<at::Tensor> png{at::Tensor(), at::Tensor(),
                                torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(1, draw, png);  // q.png: decoded here wherever it falls
    EXPECT_EQ(png[1].numel(), 0);
    EXPECT_GT(png[0].numel(), 0);
  }
  EXPECT_EQ(engines, expected_engines);
  EXPECT_GT(engines, 0);
  EXPECT_LT(engines, 8);
  fo.output = ImageFolderOutput::kEncoded;
  EXPECT_THROW(ImageFolderDataset(dir.file("root"), fo), InvalidArgument);
  fo.output = ImageFolderOutput::kCropRegion;
  fo.engine_share = 1.5;
  EXPECT_THROW(ImageFolderDataset(dir.file("root"), fo), InvalidArgument);
}

// A JPEG cut short at an engine position fails in the worker, naming the file (so skip_bad
// leaves it out), as it does on the CPU, rather than failing the engines' batch.
TEST(CropDecodeTest, ATruncatedJpegLeftToTheEnginesIsNamedByTheWorker) {
  std::vector<uint8_t> cut = detailed_photo();
  cut.resize(cut.size() * 2 / 3);
  const testing::TempDir dir;
  testing::put(dir, "root/photos/cut.jpg", cut);
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCropRegion;
  fo.engine_share = 1;
  const ImageFolderDataset folder(dir.file("root"), fo);
  std::vector<at::Tensor> out{at::Tensor(), at::Tensor(),
                              torch::empty({kCropBoxFields}, torch::kInt),
                              torch::empty({}, torch::kLong)};
  try {
    folder.get_drawn_sample(0, SampleDraw{9, 0}, out);
    FAIL() << "a truncated JPEG was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cut.jpg"), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  }
}

// A progressive JPEG at an engine position stays with the worker: the engines do not read it, and
// nvJPEG's fallback would decode it whole on the engines' one thread; a baseline one goes.
TEST(CropDecodeTest, AProgressiveJpegAtAnEnginePositionDecodesInTheWorker) {
  const testing::TempDir dir;
  const at::Tensor pixels = testing::smooth_image(3, 300, 400, 2);
  testing::put(dir, "root/photos/a_progressive.jpg", testing::progressive_jpeg(pixels));
  testing::put(dir, "root/photos/b_baseline.jpg", encode_jpeg(pixels, 90));
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCropRegion;
  fo.engine_share = 1;
  const ImageFolderDataset folder(dir.file("root"), fo);
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<at::Tensor> out{at::Tensor(), at::Tensor(),
                                torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(i, SampleDraw{9, static_cast<uint64_t>(i)}, out);
    SCOPED_TRACE(folder.samples()[static_cast<size_t>(i)].path);
    const bool progressive = i == 0;
    EXPECT_EQ(out[0].numel() > 0, progressive);   // the crop region, decoded
    EXPECT_EQ(out[1].numel() > 0, !progressive);  // the file's bytes, for the engines
  }
}

// The trial's first share counts in that the workers keep the cheaper crops: where the crops'
// times follow the cost key, the balance gives the engines less than the rates alone would;
// where every crop costs the same, the same share as the rates alone.
TEST(EngineShareTest, TheFirstShareCountsTheCropsTheWorkersKeep) {
  const auto cost = [](uint64_t p) {
    return crop_region_cpu_cost(ResizedCropSpec::train(224), SampleDraw{1, p});
  };
  std::vector<double> by_cost, alike(64, 0.004);
  for (uint64_t i = 0; i < 64; ++i) by_cost.push_back(0.004 * cost(i));
  EXPECT_DOUBLE_EQ(first_balanced_share(1000, 1000, by_cost, {}), 0.5);
  EXPECT_NEAR(first_balanced_share(1000, 1000, alike, cost), 0.5, 1.0 / 1024);
  const double share = first_balanced_share(1000, 1000, by_cost, cost);
  EXPECT_LT(share, 0.49);
  EXPECT_GT(share, 0.3);
  // At that share the workers' crops take the engines' time for their part, within a step.
  double kept = 0, all = 0;
  int64_t n = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    all += by_cost[i];
    if (engines_take_costliest(share, i, cost)) continue;
    kept += by_cost[i];
    ++n;
  }
  const double cpu_at_share = 1000 * (all / 64) / (kept / static_cast<double>(n));
  EXPECT_NEAR(share / 1000, (1 - share) / cpu_at_share, 0.02 / 1000);
  // Untimed files are left out; none timed, or a side without a rate: the rates alone.
  std::vector<double> untimed(64, 0.0);
  EXPECT_DOUBLE_EQ(first_balanced_share(3000, 1000, untimed, cost), 0.75);
  EXPECT_EQ(first_balanced_share(0, 1000, by_cost, cost), 0);
}

// A fixed share is decodes_on_engines itself, and never moves.
TEST(EngineShareTest, AFixedShareSplitsAsThePositionsPatternAndStays) {
  EngineShare fixed(0.4);
  EXPECT_FALSE(fixed.adaptive());
  for (uint64_t p = 0; p < 2048; ++p) EXPECT_EQ(fixed.on_engines(p), decodes_on_engines(0.4, p));
  fixed.record_cpu(1000, 1);
  for (int i = 0; i < 10; ++i) fixed.record_engines(100, 0.1);
  EXPECT_FALSE(fixed.rebalance(4, 256));
  ASSERT_EQ(fixed.schedule().size(), 1u);
  EXPECT_EQ(fixed.share(), std::round(0.4 * 1024) / 1024);
  EXPECT_THROW(EngineShare(1.5), InvalidArgument);
}

// Rebalancing moves the share toward the one at which both sides decode their parts of a batch
// in the same time, window by window, from the first position not yet asked about: every
// position asked keeps its side.
TEST(EngineShareTest, RebalancingBalancesBothSidesFromTheNextUnaskedPosition) {
  EngineShare share(0.25, /*adaptive=*/true);
  for (int call = 0; call < EngineShare::kEngineWarmupCalls; ++call)
    share.record_engines(100, 10);  // the engines' set-up: not counted
  std::vector<bool> before;
  for (uint64_t p = 0; p < 300; ++p) before.push_back(share.on_engines(p));
  // One window: the workers 4 at 100 img/s each, the engines 600 img/s.
  auto measure_window = [&] {
    share.record_cpu(EngineShare::kWindowBatches * 128, EngineShare::kWindowBatches * 1.28);
    for (int call = 0; call < EngineShare::kWindowBatches; ++call) share.record_engines(60, 0.1);
  };
  share.record_cpu(10, 0.1);  // too little measured: no change
  share.record_engines(60, 0.1);
  EXPECT_FALSE(share.rebalance(4, 256));
  measure_window();
  EXPECT_TRUE(share.rebalance(4, 256));
  EXPECT_EQ(share.rates(4).cpu_samples, 0) << "each window measures anew";
  const double cpu = 400, engines = 600;
  auto imbalance = [&](double s) { return (1 - s) / cpu - s / engines; };
  const double first = share.share();
  EXPECT_GT(first, 0.25) << "the CPU side was the slower: the engines take more";
  EXPECT_GT(imbalance(first), 0) << "half way: not past the balance";
  const auto schedule = share.schedule();
  ASSERT_EQ(schedule.size(), 2u);
  EXPECT_EQ(schedule[1].from_position, 300u);
  for (uint64_t p = 0; p < 300; ++p) EXPECT_EQ(share.on_engines(p), before[p]) << p;
  for (uint64_t p = 300; p < 1400; ++p)
    EXPECT_EQ(share.on_engines(p), decodes_on_engines(first, p));
  for (int window = 0; window < 12; ++window) {
    measure_window();
    share.rebalance(4, 256);
  }
  // It stops within a 1/64 of the balance (a smaller move is not made).
  EXPECT_NEAR(imbalance(share.share()), 0, (1 / cpu + 1 / engines) / 48) << share.share();
  EXPECT_NE(share.report(4).find("the JPEG engines decode"), std::string::npos) << share.report(4);
  measure_window();  // settled: the same rates again change nothing
  EXPECT_FALSE(share.rebalance(4, 256));
}

// An evaluation turns the engines on for the positions its workers have not decoded ahead,
// and off after: a set share applies from the first unasked position, and the asked ones keep
// their side.
TEST(EngineShareTest, ASetShareAppliesFromTheFirstUnaskedPosition) {
  EngineShare share(0.5, /*adaptive=*/true);
  share.set(0);  // nobody asked yet: the first share itself
  ASSERT_EQ(share.schedule().size(), 1u);
  EXPECT_EQ(share.schedule()[0].share, 0);
  for (uint64_t p = 0; p < 100; ++p) EXPECT_FALSE(share.on_engines(p)) << p;  // the ring ahead
  share.set(0.5);
  share.set(0.5);  // the same share: no change
  const auto schedule = share.schedule();
  ASSERT_EQ(schedule.size(), 2u);
  EXPECT_EQ(schedule[1].from_position, 100u);
  int engines = 0;
  for (uint64_t p = 0; p < 300; ++p) engines += share.on_engines(p) ? 1 : 0;
  EXPECT_EQ(engines, 100) << "half of the 200 positions after the ring, none before";
  share.set(0);
  EXPECT_EQ(share.schedule().back().from_position, 300u);
  EXPECT_FALSE(share.on_engines(300));
  EXPECT_THROW(share.set(1.5), InvalidArgument);
}

// The workers' time on the samples they left to the engines (reading the file, copying its
// bytes) counts against the CPU side: it is time they cannot decode in.
TEST(EngineShareTest, TheWorkersTimeOnTheEnginesSamplesCountsAgainstTheirRate) {
  EngineShare share(0.5, /*adaptive=*/true);
  share.record_cpu(100, 1.0);
  EXPECT_DOUBLE_EQ(share.rates(4).cpu_images_per_s, 400);
  share.record_cpu(0, 0.25);  // the engines' samples' reads
  EXPECT_DOUBLE_EQ(share.rates(4).cpu_images_per_s, 320);
  EXPECT_EQ(share.rates(4).cpu_samples, 100);
}

// How much of a core each side's threads had in the window: CPU time over their time on the
// samples (the workers) or on the decodes (the engines' thread), and the scheduler's switches a
// second; the report says it after the rates, and says nothing of a side not measured.
TEST(EngineShareTest, TheReportSaysHowMuchOfACoreEachSidesThreadsHad) {
  EngineShare share(0.5, /*adaptive=*/true);
  for (int call = 0; call < EngineShare::kEngineWarmupCalls; ++call)
    share.record_engines(100, 1, ThreadUsage{1, 1000});  // the set-up: not counted
  share.record_cpu(100, 1.0, ThreadUsage{0.75, 20});
  share.record_cpu(0, 1.0, ThreadUsage{0.75, 20});  // an engines' sample's read
  share.record_engines(60, 0.5, ThreadUsage{0.2, 150});
  share.record_engines(60, 0.5, ThreadUsage{0.2, 150});
  const EngineShare::Rates r = share.rates(4);
  EXPECT_DOUBLE_EQ(r.workers_on_core, 0.75);
  EXPECT_DOUBLE_EQ(r.worker_preemptions_per_s, 20);
  EXPECT_DOUBLE_EQ(r.engines_thread_on_core, 0.4);
  EXPECT_DOUBLE_EQ(r.engines_thread_preemptions_per_s, 300);
  EXPECT_NE(share.report(4).find("(in the run: CPU crop regions 200 img/s on 4 workers, engines "
                                 "120 img/s; on a core: the workers 0.75 of their time (20 "
                                 "switches/s), the engines' thread 0.4 of its decode time (300 "
                                 "switches/s))"),
            std::string::npos)
      << share.report(4);

  EngineShare unmeasured(0.5, /*adaptive=*/true);
  for (int call = 0; call < EngineShare::kEngineWarmupCalls + 1; ++call)
    unmeasured.record_engines(60, 0.5);
  unmeasured.record_cpu(100, 1.0);
  EXPECT_EQ(unmeasured.rates(4).workers_on_core, 0);
  EXPECT_EQ(unmeasured.rates(4).engines_thread_on_core, 0);
  EXPECT_NE(unmeasured.report(4).find("engines 120 img/s)"), std::string::npos)
      << unmeasured.report(4);
}

// A resumed run's schedule splits its positions as the first run did; a malformed one is named.
TEST(EngineShareTest, ARestoredScheduleSplitsAsTheSavedOne) {
  EngineShare share(0.5, /*adaptive=*/true);
  share.restore({{0, 0.25}, {1000, 0.75}});
  for (uint64_t p = 0; p < 2000; ++p)
    EXPECT_EQ(share.on_engines(p), decodes_on_engines(p < 1000 ? 0.25 : 0.75, p)) << p;
  EXPECT_EQ(share.share(), 0.75);
  EXPECT_THROW(share.restore({}), InvalidArgument);
  EXPECT_THROW(share.restore({{5, 0.5}}), InvalidArgument);
  EXPECT_THROW(share.restore({{0, 0.5}, {0, 0.25}}), InvalidArgument);
  EXPECT_THROW(share.restore({{0, 2.0}}), InvalidArgument);
}

// A dataset given an EngineShare follows it as it moves: the loader's workers ask it per sample.
TEST(EngineShareTest, ADatasetFollowsTheShareItWasGiven) {
  const testing::TempDir dir;
  testing::put(dir, "root/photos/p.jpg", detailed_photo());
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kCropRegion;
  auto share = std::make_shared<EngineShare>(0.5, /*adaptive=*/true);
  const ImageFolderDataset folder =
      ImageFolderDataset(dir.file("root"), fo).with_engine_share(share);
  EXPECT_EQ(folder.engine_share(), share);
  ASSERT_EQ(folder.fields().size(), 4u);
  share->restore({{0, 0.5}, {4, 1.0}});
  for (uint64_t position = 0; position < 8; ++position) {
    std::vector<at::Tensor> out{at::Tensor(), at::Tensor(),
                                torch::empty({kCropBoxFields}, torch::kInt),
                                torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(0, SampleDraw{5, position}, out);
    const bool costliest = engines_take_costliest(0.5, position, [](uint64_t p) {
      return crop_region_cpu_cost(ResizedCropSpec::train(224), SampleDraw{5, p});
    });
    EXPECT_EQ(out[1].numel() > 0, position >= 4 || costliest) << position;
  }
  EXPECT_GT(share->rates(1).cpu_samples, 0) << "the workers time their regions";
  fo.output = ImageFolderOutput::kCenterCrop;
  EXPECT_THROW(ImageFolderDataset(dir.file("root"), fo).with_engine_share(share), InvalidArgument);
}

// Decoded whole images (an evaluation's) split alike: the engines' samples carry the file's
// bytes and an empty image, the others the decode the unsplit dataset gives.
TEST(EngineShareTest, DecodedImagesSplitAsCropRegionsDo) {
  const std::vector<uint8_t> jpeg = detailed_photo();
  const testing::TempDir dir;
  testing::put(dir, "root/photos/p.jpg", jpeg);
  ImageFolderOptions fo;
  fo.output = ImageFolderOutput::kDecoded;
  fo.image_size = 256;
  const ImageFolderDataset plain(dir.file("root"), fo);
  const ImageFolderDataset folder = plain.with_engine_share(0.5);
  ASSERT_EQ(folder.fields().size(), 3u);
  EXPECT_EQ(folder.fields()[1].name, "jpeg");
  for (uint64_t position = 0; position < 4; ++position) {
    std::vector<at::Tensor> out{at::Tensor(), at::Tensor(), torch::empty({}, torch::kLong)};
    folder.get_drawn_sample(0, SampleDraw{9, position}, out);
    if (decodes_on_engines(0.5, position)) {
      EXPECT_EQ(out[1].numel(), static_cast<int64_t>(jpeg.size()));
      EXPECT_EQ(out[0].numel(), 0);
    } else {
      std::vector<at::Tensor> whole{at::Tensor(), torch::empty({}, torch::kLong)};
      plain.get_sample(0, whole);
      EXPECT_EQ(out[1].numel(), 0);
      EXPECT_TRUE(torch::equal(out[0], whole[0])) << position;
    }
    EXPECT_EQ(out[2].item<int64_t>(), 0);
  }
  EXPECT_FALSE(folder.with_output(ImageFolderOutput::kCropRegion).engine_share())
      << "a split is of one output's samples";
}

// The augment stage of a split run puts both sides into one batch: the rows a worker decoded
// (an empty "jpeg") resampled by their boxes, the engines' crops in the others' rows, in order.
TEST(EngineSplitTest, TheAugmentStagePutsEachSidesCropsInItsRows) {
  const ResizedCropSpec spec = ResizedCropSpec::train(16);
  // Four rows: 0 and 2 decoded by workers (regions of their own sizes), 1 and 3 the engines'.
  std::vector<at::Tensor> regions{testing::smooth_image(3, 40, 30, 1),
                                  testing::smooth_image(3, 25, 50, 2)};
  std::vector<at::Tensor> hwc;
  for (const auto& r : regions) hwc.push_back(r.permute({1, 2, 0}).contiguous().view(-1));
  const at::Tensor image = torch::cat({hwc[0], hwc[1]});
  const int64_t n0 = hwc[0].numel();
  const at::Tensor offsets = torch::tensor(std::vector<int64_t>{0, n0, n0, n0 + hwc[1].numel()});
  const at::Tensor sizes =
      torch::tensor(std::vector<int64_t>{40, 30, 3, 0, 0, 3, 25, 50, 3, 0, 0, 3}).view({4, 3});
  const at::Tensor jpeg_sizes = torch::tensor(std::vector<int64_t>{0, 900, 0, 700});
  std::vector<int32_t> box_values;
  for (const auto& [h, w] : {std::pair<int64_t, int64_t>{40, 30}, {1, 1}, {25, 50}, {1, 1}}) {
    int32_t box[kCropBoxFields];
    draw_crop_box(spec, h, w, SampleDraw{3, static_cast<uint64_t>(h)}, box);
    box_values.insert(box_values.end(), box, box + kCropBoxFields);
  }
  const at::Tensor boxes = torch::tensor(box_values, torch::kInt).view({4, kCropBoxFields});
  const at::Tensor engine_crops = torch::randn({2, 3, 16, 16});

  const FeedStage stage = split_crops_feed(spec, /*channels_last=*/true);
  EXPECT_EQ(stage.outputs, std::vector<std::string>{"x"});
  const at::Tensor x = stage.fn({image, offsets, sizes, jpeg_sizes, boxes, engine_crops}).at(0);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{4, 3, 16, 16}));
  EXPECT_TRUE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
  const at::Tensor cpu_rows = torch::tensor(std::vector<int64_t>{0, 2});
  const at::Tensor workers =
      resized_crop(image, offsets.index_select(0, cpu_rows), sizes.index_select(0, cpu_rows),
                   boxes.index_select(0, cpu_rows), spec);
  EXPECT_TRUE(torch::equal(x[0], workers[0]));
  EXPECT_TRUE(torch::equal(x[2], workers[1]));
  EXPECT_TRUE(torch::equal(x[1], engine_crops[0]));
  EXPECT_TRUE(torch::equal(x[3], engine_crops[1]));

  // One side with the whole batch: its crops are the batch.
  const at::Tensor all_engines = torch::tensor(std::vector<int64_t>{5, 900, 6, 700});
  const at::Tensor all_crops = torch::randn({4, 3, 16, 16});
  EXPECT_TRUE(torch::equal(stage.fn({image, offsets, sizes, all_engines, boxes, all_crops}).at(0),
                           all_crops));
  const at::Tensor two_rows = torch::tensor(std::vector<int64_t>{0, 0});
  const at::Tensor x2 =
      stage
          .fn({image, offsets.index_select(0, cpu_rows), sizes.index_select(0, cpu_rows), two_rows,
               boxes.index_select(0, cpu_rows), torch::empty({0, 3, 16, 16})})
          .at(0);
  EXPECT_TRUE(torch::equal(x2, workers));
  // Crops that do not match the rows left to the engines: an error that says so.
  try {
    stage.fn({image, offsets, sizes, jpeg_sizes, boxes, torch::randn({3, 3, 16, 16})});
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not match the batch's 2 rows"), std::string::npos)
        << e.what();
  }
}

// shrink_image: a photo written again at the least size that keeps every RandomResizedCrop box
// at 224 px. The crops of the shrunk photo against torchvision's crops of the original (the
// full-resolution decode, the box cut, resized to 224), and against the crops of the same photo
// shrunk to a fixed shorter side of 256 px (FFCV's way), which enlarges the small boxes. The PSNRs
// are printed (and stated in docs/notes/cpu-decode.md).
TEST(ShrinkTest, TheKeptSizeHoldsTheSmallestCropAtTheModelsSize) {
  const KeptSize k = kept_size(224);
  EXPECT_EQ(k.min_area, 836267);  // 224^2 / (0.08 * 3/4), rounded up
  EXPECT_EQ(k.min_short_side, 256);
  // The smallest box of that area (scale 0.08, ratio 3/4 or 4/3) has 224 px on its short side.
  EXPECT_GE(std::sqrt(static_cast<double>(k.min_area) * 0.08 * 0.75), 224.0);
  EXPECT_EQ(kept_size(112, 0.25).min_area, 66902);
  EXPECT_THROW(kept_size(0), InvalidArgument);
  EXPECT_THROW(kept_size(224, 0), InvalidArgument);
  EXPECT_THROW(kept_size(224, 1.5), InvalidArgument);
}

TEST(ShrinkTest, TheShrunkShapeIsTheLeastThatKeepsBothBounds) {
  const KeptSize k = kept_size(224);
  for (const auto& [h, w] : {std::array<int64_t, 2>{3000, 4000},
                             {4000, 3000},
                             {1200, 1600},
                             {1000, 2000},
                             {2000, 2000}}) {
    const auto [sh, sw] = shrunk_shape(h, w, k);
    SCOPED_TRACE(std::to_string(h) + " x " + std::to_string(w));
    EXPECT_GE(sh * sw, k.min_area);
    EXPECT_LT((sh - 1) * (sw - 1), k.min_area);  // one pixel less a side would miss it
    EXPECT_NEAR(static_cast<double>(sh) / sw, static_cast<double>(h) / w, 2.0 / sw);
  }
  // A panorama: the evaluation's shorter side binds.
  EXPECT_EQ(shrunk_shape(400, 8000, k), (std::array<int64_t, 2>{256, 5120}));
  // Small enough: unchanged.
  EXPECT_EQ(shrunk_shape(480, 640, k), (std::array<int64_t, 2>{480, 640}));
  EXPECT_EQ(shrunk_shape(792, 1056, k), (std::array<int64_t, 2>{792, 1056}));
}

TEST(ShrinkTest, TheShrunkPhotosCropsAreTorchvisionsCropsOfTheOriginal) {
  const int64_t H = 2400, W = 3200;
  const std::vector<uint8_t> jpeg = detailed_photo(H, W);
  const ShrunkImage s = shrink_image(jpeg, "photo.jpg", kept_size(224));
  ASSERT_TRUE(s.shrunk);
  EXPECT_EQ((std::array<int64_t, 2>{s.out_height, s.out_width}),
            shrunk_shape(H, W, kept_size(224)));
  EXPECT_EQ((std::array<int64_t, 2>{s.height, s.width}), (std::array<int64_t, 2>{H, W}));
  EXPECT_LT(s.bytes.size() * 4, jpeg.size());  // 9 times fewer pixels
  const at::Tensor full = decode_image_interleaved(jpeg, "photo.jpg", 3);
  const at::Tensor shrunk = decode_image_interleaved(s.bytes, "shrunk.jpg", 3);
  ASSERT_EQ(shrunk.size(0), s.out_height);
  ASSERT_EQ(shrunk.size(1), s.out_width);
  // FFCV's way: the shorter side to 256.
  const std::vector<uint8_t> fixed = encode_jpeg(
      resize_bilinear(decode_image(jpeg, "photo.jpg", 3, 256, 256), 256, W * 256 / H), 95);
  const at::Tensor small = decode_image_interleaved(fixed, "fixed.jpg", 3);
  // Boxes of RandomResizedCrop's range, in the original's pixels: the smallest (scale 0.08,
  // ratio 3/4 and 4/3), middling ones, the whole image.
  const double area = static_cast<double>(H * W);
  struct Box {
    double scale, ratio, top, left;
  };
  for (const Box& b : {Box{0.08, 0.75, 100, 200}, Box{0.08, 4.0 / 3, 1500, 2000},
                       Box{0.25, 1.0, 700, 900}, Box{0.5, 0.8, 300, 400}, Box{1.0, 0.75, 0, 0}}) {
    const double bw = std::min<double>(W, std::sqrt(area * b.scale * b.ratio));
    const double bh = std::min<double>(H, std::sqrt(area * b.scale / b.ratio));
    const double top = std::min(b.top, H - bh), left = std::min(b.left, W - bw);
    const at::Tensor reference = resize_box(full, top, left, bh, bw);
    const double f = static_cast<double>(s.out_height) / H;  // both sides alike, within a pixel
    const double g = static_cast<double>(small.size(0)) / H;
    const double shrunk_db = psnr(resize_box(shrunk, top * f, left * f, bh * f, bw * f), reference);
    const double fixed_db =
        psnr(resize_box(small, top * g, left * g, std::min(bh * g, small.size(0) - top * g),
                        std::min(bw * g, small.size(1) - left * g)),
             reference);
    std::printf(
        "box %4.0f x %4.0f (scale %.2f): from the shrunk photo (%lld x %lld) %.1f dB, from the "
        "256 px one %.1f dB\n",
        bh, bw, b.scale, static_cast<long long>(s.out_height), static_cast<long long>(s.out_width),
        shrunk_db, fixed_db);
    EXPECT_GE(bh * f, 224 - 1);  // never enlarged (a pixel of rounding)
    EXPECT_GE(bw * f, 224 - 1);
    EXPECT_GE(shrunk_db, 30.0);
    if (bh * g < 224 || bw * g < 224) {
      EXPECT_GE(shrunk_db, fixed_db + 3.0);  // where the fixed side enlarges the box
    }
  }
}

// A PNG larger than the crops need: written as a PNG of what training decodes, resized once —
// exactly, since PNG is lossless. Gray stays gray; transparency is dropped as training drops it.
TEST(ShrinkTest, ALargePngIsWrittenSmallerAsWhatTrainingDecodes) {
  const KeptSize k = kept_size(224);
  const at::Tensor photo = decode_image(detailed_photo(), "photo.jpg", 3);  // 1200 x 1600
  const std::vector<uint8_t> png = encode_png(photo);
  const ShrunkImage s = shrink_image(png, "big.png", k);
  ASSERT_TRUE(s.shrunk);
  const auto [h, w] = shrunk_shape(1200, 1600, k);
  EXPECT_EQ((std::array<int64_t, 2>{s.out_height, s.out_width}), (std::array<int64_t, 2>{h, w}));
  EXPECT_EQ(read_image_info(s.bytes, "s.png").format, ImageFormat::kPng);
  EXPECT_LT(s.bytes.size(), png.size());
  EXPECT_TRUE(decode_image(s.bytes, "s.png", 3).equal(resize_bilinear(photo, h, w)));

  const at::Tensor gray = decode_image(detailed_photo(), "photo.jpg", 1);
  const ShrunkImage g = shrink_image(encode_png(gray), "gray.png", k);
  ASSERT_TRUE(g.shrunk);
  EXPECT_EQ(read_image_info(g.bytes, "g.png").channels, 1);
  EXPECT_TRUE(decode_image(g.bytes, "g.png", 1).equal(resize_bilinear(gray, h, w)));

  // RGBA: training's decode drops the alpha, and so does the shrunk file.
  testing::RawPng rgba;
  rgba.width = 1600;
  rgba.height = 1200;
  rgba.color_type = PNG_COLOR_TYPE_RGB_ALPHA;
  const at::Tensor hwc = photo.permute({1, 2, 0}).contiguous();
  const uint8_t* rgb = hwc.data_ptr<uint8_t>();
  for (int64_t y = 0; y < 1200; ++y) {
    std::vector<uint8_t> row(1600 * 4);
    for (int64_t x = 0; x < 1600; ++x) {
      std::copy_n(rgb + (y * 1600 + x) * 3, 3, row.begin() + x * 4);
      row[x * 4 + 3] = static_cast<uint8_t>(x % 256);
    }
    rgba.rows.push_back(std::move(row));
  }
  const std::vector<uint8_t> with_alpha = testing::raw_png(rgba);
  ASSERT_EQ(read_image_info(with_alpha, "a.png").channels, 4);
  const ShrunkImage a = shrink_image(with_alpha, "a.png", k);
  ASSERT_TRUE(a.shrunk);
  EXPECT_EQ(read_image_info(a.bytes, "a2.png").channels, 3);
  EXPECT_TRUE(decode_image(a.bytes, "a2.png", 3)
                  .equal(resize_bilinear(decode_image(with_alpha, "a.png", 3), h, w)));
}

TEST(ShrinkTest, WhatItDoesNotShrinkKeepsItsBytes) {
  const KeptSize k = kept_size(224);
  const std::vector<uint8_t> small = encode_jpeg(testing::smooth_image(3, 480, 640), 90);
  ShrunkImage s = shrink_image(small, "small.jpg", k);
  EXPECT_FALSE(s.shrunk);
  EXPECT_EQ(s.kept_because, "small enough");
  EXPECT_EQ(s.bytes, small);
  const std::vector<uint8_t> small_png = encode_png(testing::smooth_image(3, 480, 640));
  s = shrink_image(small_png, "small.png", k);
  EXPECT_FALSE(s.shrunk);
  EXPECT_EQ(s.kept_because, "small enough");
  EXPECT_EQ(s.bytes, small_png);
  const int cw = 1600, ch = 1200;
  const std::vector<uint8_t> cmyk =
      testing::cmyk_jpeg(std::vector<uint8_t>(cw * ch * 4, 90), cw, ch);
  s = shrink_image(cmyk, "cmyk.jpg", k);
  EXPECT_EQ(s.kept_because, "a CMYK JPEG");
  EXPECT_EQ(s.bytes, cmyk);
  // Gray stays gray.
  const ShrunkImage gray =
      shrink_image(encode_jpeg(decode_image(detailed_photo(), "photo.jpg", 1), 95), "gray.jpg", k);
  ASSERT_TRUE(gray.shrunk);
  EXPECT_EQ(read_image_info(gray.bytes, "g.jpg").channels, 1);
}

// A marker segment: FF, the marker, a big-endian length that counts itself, the payload.
std::vector<uint8_t> segment(uint8_t marker, const std::string& payload) {
  const size_t length = payload.size() + 2;
  std::vector<uint8_t> s(2 + length);
  s[0] = 0xFF;
  s[1] = marker;
  s[2] = static_cast<uint8_t>(length >> 8);
  s[3] = static_cast<uint8_t>(length & 0xFF);
  std::copy(payload.begin(), payload.end(), s.begin() + 4);
  return s;
}

bool contains(const std::vector<uint8_t>& bytes, const std::string& text) {
  return std::search(bytes.begin(), bytes.end(), text.begin(), text.end()) != bytes.end();
}

TEST(ShrinkTest, TheShrunkPhotoKeepsTheOriginalsMetadata) {
  // A camera's layout: SOI, EXIF (APP1) with no JFIF header, an ICC profile (APP2), a comment, an
  // Adobe APP14; then the tables and the scan of an encoded photo (after its own JFIF APP0).
  const std::vector<uint8_t> coded = detailed_photo(1200, 1600);
  ASSERT_EQ(coded[2], 0xFF);
  ASSERT_EQ(coded[3], 0xE0);  // the encoder's JFIF APP0
  const size_t after_jfif = 4 + ((size_t{coded[4]} << 8) | coded[5]);
  const std::string exif = std::string("Exif\0\0MM\0*", 10) + std::string(300, 'e');
  const std::string icc = std::string("ICC_PROFILE\0\1\1", 14) + std::string(500, 'c');
  std::vector<uint8_t> metadata;
  for (const auto& seg : {segment(0xE1, exif), segment(0xE2, icc), segment(0xFE, "shot by a test")})
    metadata.insert(metadata.end(), seg.begin(), seg.end());
  std::vector<uint8_t> photo = {0xFF, 0xD8};
  photo.insert(photo.end(), metadata.begin(), metadata.end());
  const std::vector<uint8_t> adobe = segment(0xEE, std::string("Adobe\0\144\0\0\0\0\1", 12));
  photo.insert(photo.end(), adobe.begin(), adobe.end());
  photo.insert(photo.end(), coded.begin() + static_cast<long>(after_jfif), coded.end());
  ASSERT_EQ(decode_image(photo, "camera.jpg", 3).sizes().vec(),
            (std::vector<int64_t>{3, 1200, 1600}));

  const ShrunkImage kept = shrink_image(photo, "camera.jpg", kept_size(224));
  ASSERT_TRUE(kept.shrunk);
  // SOI, then the original's segments byte for byte and in order, in place of the encoder's JFIF.
  ASSERT_GT(kept.bytes.size(), 2 + metadata.size());
  EXPECT_TRUE(std::equal(metadata.begin(), metadata.end(), kept.bytes.begin() + 2));
  EXPECT_FALSE(contains(kept.bytes, "JFIF"));
  EXPECT_FALSE(contains(kept.bytes, "Adobe"));  // it described the original's coding
  const at::Tensor image = decode_image(kept.bytes, "kept.jpg", 3);
  EXPECT_EQ(image.sizes().vec(), (std::vector<int64_t>{3, kept.out_height, kept.out_width}));

  // Stripped: the encoder's own header, none of the photo's.
  const ShrunkImage stripped = shrink_image(photo, "camera.jpg", kept_size(224), 95,
                                            ChromaSubsampling::k420, /*keep_metadata=*/false);
  EXPECT_TRUE(contains(stripped.bytes, "JFIF"));
  EXPECT_FALSE(contains(stripped.bytes, "Exif"));
  EXPECT_FALSE(contains(stripped.bytes, "ICC_PROFILE"));
  EXPECT_EQ(stripped.bytes.size() + metadata.size(), kept.bytes.size() + after_jfif - 2);
  EXPECT_TRUE(torch::equal(decode_image(stripped.bytes, "stripped.jpg", 3), image));

  // A JFIF photo keeps its own JFIF header (first, as it was) and its comment.
  std::vector<uint8_t> jfif(coded.begin(), coded.begin() + static_cast<long>(after_jfif));
  const std::vector<uint8_t> comment = segment(0xFE, "a comment");
  jfif.insert(jfif.end(), comment.begin(), comment.end());
  jfif.insert(jfif.end(), coded.begin() + static_cast<long>(after_jfif), coded.end());
  const ShrunkImage with_jfif = shrink_image(jfif, "jfif.jpg", kept_size(224));
  ASSERT_TRUE(with_jfif.shrunk);
  EXPECT_TRUE(
      std::equal(jfif.begin(),
                 jfif.begin() + static_cast<long>(after_jfif) + static_cast<long>(comment.size()),
                 with_jfif.bytes.begin()));
}

TEST(ShrinkTest, AProgressivePhotoComesOutBaselineWithItsPixels) {
  const KeptSize k = kept_size(224);
  // Small enough: made baseline without a loss.
  const std::vector<uint8_t> small = testing::progressive_jpeg(testing::smooth_image(3, 480, 640));
  const ShrunkImage s = shrink_image(small, "small.jpg", k);
  EXPECT_FALSE(s.shrunk);
  EXPECT_TRUE(s.made_baseline);
  EXPECT_EQ(s.kept_because, "");
  EXPECT_FALSE(read_image_info(s.bytes, "s.jpg").progressive);
  EXPECT_TRUE(decode_image(s.bytes, "s.jpg", 3).equal(decode_image(small, "small.jpg", 3)));
  // Larger than the crops need: shrunk, into a baseline JPEG.
  const at::Tensor photo = decode_image(detailed_photo(), "photo.jpg", 3);
  const ShrunkImage big = shrink_image(testing::progressive_jpeg(photo, 95), "big.jpg", k);
  EXPECT_TRUE(big.shrunk);
  EXPECT_FALSE(big.made_baseline);
  EXPECT_FALSE(read_image_info(big.bytes, "b.jpg").progressive);
  // A baseline photo small enough is copied as it was.
  const std::vector<uint8_t> plain = encode_jpeg(testing::smooth_image(3, 480, 640), 90);
  EXPECT_FALSE(shrink_image(plain, "plain.jpg", k).made_baseline);
}

TEST(ShrinkTest, TheSurveySaysWhenPhotosAreLargerThanTheCropsNeed) {
  const testing::TempDir dir;
  for (int i = 0; i < 3; ++i)  // 1.92 megapixels: 2.3 x what 224 px crops need
    testing::put(dir, "root/a/big" + std::to_string(i) + ".jpg",
                 encode_jpeg(testing::smooth_image(3, 1200, 1600, i), 80));
  for (int i = 0; i < 2; ++i)
    testing::put(dir, "root/b/small" + std::to_string(i) + ".jpg",
                 encode_jpeg(testing::smooth_image(3, 100, 120, i), 80));
  const std::string root = testing::join(dir.path(), "root");
  const KeptSize k = kept_size(224);
  const PhotoSizes sizes = survey_photo_sizes(ImageFolderDataset(root), k);
  EXPECT_EQ(sizes.sampled, 5);
  EXPECT_EQ(sizes.median_pixels, 1200.0 * 1600);
  EXPECT_NEAR(sizes.over_kept, 1200.0 * 1600 / 836267, 1e-9);
  const std::string hint = shrink_hint(sizes, k, 224, root);
  EXPECT_NE(hint.find("photos of about 1.9 megapixels (the median of 5), 2.3 x what 224 px crops "
                      "need: `tandem shrink --data " +
                      root + " --out " + root + "-shrunk` writes them at 0.84 megapixels"),
            std::string::npos)
      << hint;
  EXPECT_EQ(shrink_hint(sizes, k, 224, root, 3.0), "");  // under the factor asked
  EXPECT_EQ(survey_photo_sizes(ImageFolderDataset(root), k, 2).sampled, 2);
  const PhotoSizes small =
      survey_photo_sizes(ImageFolderDataset(testing::join(dir.path(), "root")), kept_size(900));
  EXPECT_EQ(shrink_hint(small, kept_size(900), 900, root), "");  // 900 px crops need more
  EXPECT_EQ(sizes.progressive, 0);

  // Progressive photos: counted, and named in the hint on their own or beside the size.
  testing::put(dir, "root/b/prog.jpg",
               testing::progressive_jpeg(testing::smooth_image(3, 100, 120, 3)));
  const PhotoSizes mixed = survey_photo_sizes(ImageFolderDataset(root), k);
  EXPECT_EQ(mixed.sampled, 6);
  EXPECT_EQ(mixed.progressive, 1);
  const std::string both = shrink_hint(mixed, k, 224, root);
  EXPECT_NE(both.find("writes them at 0.84 megapixels"), std::string::npos) << both;
  EXPECT_NE(both.find("and as baseline JPEGs: 1 of the 6 are progressive"), std::string::npos)
      << both;
  const PhotoSizes for_900 = survey_photo_sizes(ImageFolderDataset(root), kept_size(900));
  const std::string only = shrink_hint(for_900, kept_size(900), 900, root);
  EXPECT_EQ(only.rfind("1 of 6 photos sampled are progressive JPEGs", 0), 0u) << only;
  EXPECT_NE(only.find("`tandem shrink --data " + root + " --out " + root +
                      "-shrunk` writes them as baseline without a loss"),
            std::string::npos)
      << only;
  PhotoSizes few = for_900;
  few.sampled = 9;  // under one in eight: not worth a line
  EXPECT_EQ(shrink_hint(few, kept_size(900), 900, root), "");
}

TEST(ShrinkTest, ATruncatedJpegIsNamed) {
  const std::vector<uint8_t> good = encode_jpeg(testing::smooth_image(3, 1200, 1600), 90);
  const std::vector<uint8_t> cut(good.begin(), good.begin() + good.size() / 2);
  try {
    shrink_image(cut, "/photos/cut.jpg", kept_size(224));
    ADD_FAILURE() << "no error for a truncated JPEG";
  } catch (const Error& e) {
    testing::expect_one_line_naming(e.what(), "/photos/cut.jpg", "");
  }
}

}  // namespace
}  // namespace tandem::data
