// decode.h: format sniffing, JPEG (RGB, gray, CMYK, scaled) and PNG (every color type and
// depth) decode to 1 or 3 channels, masks, encoders, file reading, and every bad input.
#include "tandem/data/decode.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "fixtures.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

using testing::expect_one_line_naming;
using testing::RawPng;
using testing::TempDir;

int64_t max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return a.to(at::kInt).sub(b.to(at::kInt)).abs().max().item<int64_t>();
}
double mean_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return a.to(at::kFloat).sub(b.to(at::kFloat)).abs().mean().item<double>();
}

at::Tensor luma_of(const at::Tensor& rgb) {  // (3, H, W) uint8 -> (1, H, W), libjpeg's weights
  const at::Tensor c = rgb.to(at::kLong);
  return c[0]
      .mul(19595)
      .add(c[1].mul(38470))
      .add(c[2].mul(7471))
      .add(32768)
      .div(65536, "floor")
      .to(at::kByte)
      .unsqueeze(0);
}

// Error (not InvalidArgument) with a one-line message naming the path and the cause.
template <typename F>
void expect_decode_error(F&& f, const std::string& path, const std::string& cause) {
  try {
    f();
    ADD_FAILURE() << "no error for " << path;
  } catch (const InvalidArgument& e) {
    ADD_FAILURE() << "InvalidArgument instead of Error: " << e.what();
  } catch (const Error& e) {
    expect_one_line_naming(e.what(), path, cause);
  }
}

TEST(DecodeTest, SniffsFormatsByMagicBytes) {
  const auto jpeg = encode_jpeg(testing::smooth_image(3, 8, 8), 90);
  const auto png = encode_png(testing::smooth_image(3, 8, 8));
  EXPECT_EQ(sniff_format(jpeg), ImageFormat::kJpeg);
  EXPECT_EQ(sniff_format(png), ImageFormat::kPng);
  EXPECT_EQ(sniff_format(std::vector<uint8_t>{}), ImageFormat::kUnknown);
  EXPECT_EQ(sniff_format(std::vector<uint8_t>{0xFF, 0xD8}), ImageFormat::kUnknown);
  EXPECT_EQ(sniff_format(std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', ' ', 'p', 'n', 'g'}),
            ImageFormat::kUnknown);
  EXPECT_STREQ(format_name(ImageFormat::kPng), "png");
}

TEST(DecodeTest, JpegRoundTripsRgbAndGray) {
  const at::Tensor rgb = testing::smooth_image(3, 48, 64, 1);
  const auto bytes = encode_jpeg(rgb, 95, ChromaSubsampling::k444);
  const at::Tensor out = decode_image(bytes, "rgb.jpg", 3);
  ASSERT_EQ(out.sizes(), rgb.sizes());
  EXPECT_EQ(out.scalar_type(), at::kByte);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_LE(max_abs_diff(out, rgb), 12);
  EXPECT_LT(mean_abs_diff(out, rgb), 1.5);

  // RGB JPEG to gray: libjpeg's Y plane, i.e. BT.601 luma of the pixels.
  const at::Tensor gray = decode_image(bytes, "rgb.jpg", 1);
  ASSERT_EQ(gray.sizes(), (std::vector<int64_t>{1, 48, 64}));
  EXPECT_LT(mean_abs_diff(gray, luma_of(rgb)), 1.5);

  // Gray JPEG to RGB: three equal planes.
  const at::Tensor g = testing::smooth_image(1, 40, 30, 2);
  const auto gray_bytes = encode_jpeg(g, 95);
  const at::Tensor g3 = decode_image(gray_bytes, "gray.jpg", 3);
  ASSERT_EQ(g3.sizes(), (std::vector<int64_t>{3, 40, 30}));
  EXPECT_TRUE(g3[0].equal(g3[1]) && g3[1].equal(g3[2]));
  EXPECT_LE(max_abs_diff(g3[0].unsqueeze(0), g), 6);
  EXPECT_TRUE(decode_image(gray_bytes, "gray.jpg", 1).equal(g3[0].unsqueeze(0)));

  const ImageInfo info = read_image_info(bytes, "rgb.jpg");
  EXPECT_EQ(info.format, ImageFormat::kJpeg);
  EXPECT_EQ(info.height, 48);
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.channels, 3);
  EXPECT_EQ(read_image_info(gray_bytes, "gray.jpg").channels, 1);
}

TEST(DecodeTest, ScaledJpegDecodePicksTheSmallestScaleCoveringTheMinimum) {
  const at::Tensor rgb = testing::smooth_image(3, 480, 640, 3);
  const auto bytes = encode_jpeg(rgb, 90);
  auto shape = [&](int64_t min_h, int64_t min_w) {
    return decode_image(bytes, "big.jpg", 3, min_h, min_w).sizes().vec();
  };
  EXPECT_EQ(shape(0, 0), (std::vector<int64_t>{3, 480, 640}));      // no minimum: full size
  EXPECT_EQ(shape(224, 224), (std::vector<int64_t>{3, 240, 320}));  // 1/2
  EXPECT_EQ(shape(224, 298), (std::vector<int64_t>{3, 240, 320}));  // Resize(224)'s target
  EXPECT_EQ(shape(100, 100), (std::vector<int64_t>{3, 120, 160}));  // 1/4
  EXPECT_EQ(shape(60, 80), (std::vector<int64_t>{3, 60, 80}));      // 1/8
  EXPECT_EQ(shape(241, 10), (std::vector<int64_t>{3, 480, 640}));   // 1/2 too small
  EXPECT_EQ(shape(10, 321), (std::vector<int64_t>{3, 480, 640}));
  EXPECT_EQ(shape(1000, 1000), (std::vector<int64_t>{3, 480, 640}));  // never upscales
  // 5/8 (300 x 400) would cover this too, but libjpeg-turbo's fractional scales run a plain-C
  // IDCT that decodes slower than full size: only 1/2, 1/4 and 1/8 are used.
  EXPECT_EQ(shape(300, 300), (std::vector<int64_t>{3, 480, 640}));

  // The 1/2 decode is the picture at half size: close to a 2 x 2 box filter of the full one.
  const at::Tensor full = decode_image(bytes, "big.jpg", 3).to(at::kFloat);
  const at::Tensor box = full.view({3, 240, 2, 320, 2}).mean({2, 4});
  const at::Tensor half = decode_image(bytes, "big.jpg", 3, 224, 224);
  EXPECT_LT(mean_abs_diff(half, box), 1.5);
}

// Without a minimum size the decode is libjpeg's accurate one (TurboJPEG's defaults: islow IDCT,
// fancy upsampling; what PIL gives). With one the image is going to be resized, so the fast IDCT
// and chroma upsampling are used: close to the accurate decode, not equal.
TEST(DecodeTest, DecodeWithAMinimumSizeIsTheFastOneAndCloseToTheAccurateOne) {
  const int h = 90, w = 120;
  const auto bytes = encode_jpeg(testing::smooth_image(3, h, w, 11), 90);  // 4:2:0
  at::Tensor hwc = at::empty({h, w, 3}, at::kByte);
  tjhandle tj = tjInitDecompress();
  const int status = tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()),
                                   hwc.data_ptr<uint8_t>(), w, 0, h, TJPF_RGB, 0);
  tjDestroy(tj);
  ASSERT_EQ(status, 0);
  const at::Tensor accurate = hwc.permute({2, 0, 1}).contiguous();
  EXPECT_TRUE(decode_image(bytes, "a.jpg", 3).equal(accurate));
  const at::Tensor fast = decode_image(bytes, "a.jpg", 3, h, w);  // covered only at full size
  ASSERT_EQ(fast.sizes(), accurate.sizes());
  EXPECT_FALSE(fast.equal(accurate));
  EXPECT_LT(mean_abs_diff(fast, accurate), 1.5);
  EXPECT_LE(max_abs_diff(fast, accurate), 24);
}

// baseline_jpeg: a progressive JPEG's coefficients in sequential scans, so the same pixels.
TEST(DecodeTest, AProgressiveJpegMadeBaselineDecodesToTheSamePixels) {
  const std::vector<uint8_t> coded =
      testing::progressive_jpeg(testing::smooth_image(3, 97, 131, 4));
  // A comment after SOI: the transform keeps every marker segment.
  const std::string text = "kept by the transform";
  std::vector<uint8_t> progressive(coded.begin(), coded.begin() + 2);
  const size_t length = text.size() + 2;
  for (const size_t b : {size_t{0xFF}, size_t{0xFE}, length >> 8, length & 0xFF})
    progressive.push_back(static_cast<uint8_t>(b));
  progressive.insert(progressive.end(), text.begin(), text.end());
  progressive.insert(progressive.end(), coded.begin() + 2, coded.end());
  EXPECT_TRUE(read_image_info(progressive, "p.jpg").progressive);

  const std::vector<uint8_t> baseline = baseline_jpeg(progressive, "p.jpg");
  const ImageInfo info = read_image_info(baseline, "b.jpg");
  EXPECT_FALSE(info.progressive);
  EXPECT_EQ(info.height, 97);
  EXPECT_EQ(info.width, 131);
  const std::vector<uint8_t> sof0 = {0xFF, 0xC0};  // a baseline frame, what the engines read
  EXPECT_NE(std::search(baseline.begin(), baseline.end(), sof0.begin(), sof0.end()),
            baseline.end());
  EXPECT_NE(std::search(baseline.begin(), baseline.end(), text.begin(), text.end()),
            baseline.end());
  EXPECT_TRUE(decode_image(baseline, "b.jpg", 3).equal(decode_image(progressive, "p.jpg", 3)));
  EXPECT_TRUE(decode_image(baseline, "b.jpg", 3, 48, 64)
                  .equal(decode_image(progressive, "p.jpg", 3, 48, 64)));
  // A baseline file stays baseline with the same pixels; other files are named.
  const std::vector<uint8_t> plain = encode_jpeg(testing::smooth_image(3, 40, 56, 1), 90);
  EXPECT_FALSE(read_image_info(plain, "plain.jpg").progressive);
  EXPECT_TRUE(decode_image(baseline_jpeg(plain, "plain.jpg"), "b", 3)
                  .equal(decode_image(plain, "plain.jpg", 3)));
  const std::vector<uint8_t> cut(progressive.begin(),
                                 progressive.begin() + static_cast<long>(progressive.size() / 2));
  for (const auto& [bad, path] : {std::pair{cut, std::string("/photos/cut.jpg")},
                                  {encode_png(testing::smooth_image(3, 8, 8)), "/photos/a.png"}}) {
    try {
      baseline_jpeg(bad, path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      testing::expect_one_line_naming(e.what(), path, "");
    }
  }
}

TEST(DecodeTest, ProgressiveJpegsAndHarmlessJunkBetweenSegmentsDecode) {
  const at::Tensor rgb = testing::smooth_image(3, 96, 128, 10);
  const std::vector<uint8_t> progressive = testing::progressive_jpeg(rgb);
  const at::Tensor full = decode_image(progressive, "p.jpg", 3);
  EXPECT_LT(mean_abs_diff(full, rgb), 2.0);
  EXPECT_EQ(decode_image(progressive, "p.jpg", 3, 48, 64).sizes().vec(),
            (std::vector<int64_t>{3, 48, 64}));

  // Two junk bytes between segments (before SOS): libjpeg warns "Corrupt JPEG data: 2
  // extraneous bytes before marker 0xda", but the pixels are intact, so the decode succeeds (as
  // PIL's does) and equals the clean one. Junk after the image data, before EOI, likewise.
  const auto clean = encode_jpeg(rgb, 90);
  const at::Tensor clean_pixels = decode_image(clean, "clean.jpg", 3);
  size_t sos = 0;
  for (size_t i = 2; i + 1 < clean.size() && sos == 0; ++i)
    if (clean[i] == 0xFF && clean[i + 1] == 0xDA) sos = i;
  ASSERT_GT(sos, 0u);
  std::vector<uint8_t> junk(clean.begin(), clean.begin() + sos);
  junk.insert(junk.end(), {0x12, 0x34});
  junk.insert(junk.end(), clean.begin() + sos, clean.end());
  EXPECT_EQ(read_image_info(junk, "junk.jpg").width, 128);
  EXPECT_TRUE(decode_image(junk, "junk.jpg", 3).equal(clean_pixels));
  std::vector<uint8_t> tail(clean.begin(), clean.end() - 2);
  tail.insert(tail.end(), {0x12, 0x34, 0xFF, 0xD9});
  EXPECT_TRUE(decode_image(tail, "tail.jpg", 3).equal(clean_pixels));
}

TEST(DecodeTest, AdobeCmykJpegIsReadAsInvertedCmyk) {
  // Photoshop stores inverted CMYK (255 = no ink). With K' = 255 (no black) the stored C', M',
  // Y' are the red, green, blue of the picture; with K' = 128 every channel is about halved.
  const int h = 32, w = 48;
  const at::Tensor rgb = testing::smooth_image(3, h, w, 4);
  const uint8_t* p = rgb.data_ptr<uint8_t>();
  std::vector<uint8_t> cmyk(size_t{h} * w * 4);
  for (int i = 0; i < h * w; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = p[c * h * w + i];
    cmyk[4 * i + 3] = i < h * w / 2 ? 255 : 128;  // top half no black, bottom half K = 50 %
  }
  const auto bytes = testing::cmyk_jpeg(cmyk, w, h);
  EXPECT_EQ(read_image_info(bytes, "cmyk.jpg").channels, 4);
  const at::Tensor out = decode_image(bytes, "cmyk.jpg", 3);
  ASSERT_EQ(out.sizes(), rgb.sizes());
  const at::Tensor top = out.narrow(1, 0, h / 2), top_ref = rgb.narrow(1, 0, h / 2);
  EXPECT_LT(mean_abs_diff(top, top_ref), 2.0);
  const at::Tensor bottom_ref =
      rgb.narrow(1, h / 2, h / 2).to(at::kFloat).mul(128.0 / 255.0).round().to(at::kByte);
  EXPECT_LT(mean_abs_diff(out.narrow(1, h / 2, h / 2), bottom_ref), 2.0);
  // To gray: the luma of the converted RGB.
  EXPECT_LE(max_abs_diff(decode_image(bytes, "cmyk.jpg", 1), luma_of(out)), 1);
  // Scaled decode works for CMYK too.
  EXPECT_EQ(decode_image(bytes, "cmyk.jpg", 3, 16, 24).sizes().vec(),
            (std::vector<int64_t>{3, 16, 24}));
}

TEST(DecodeTest, PngRgbAndGrayAreLosslessAndConvertedExactly) {
  const at::Tensor rgb = testing::smooth_image(3, 21, 33, 5);
  const auto bytes = encode_png(rgb);
  EXPECT_TRUE(decode_image(bytes, "rgb.png", 3).equal(rgb));
  EXPECT_TRUE(decode_image(bytes, "rgb.png", 1).equal(luma_of(rgb)));
  // Same weights as a JPEG decoded to gray from the same RGB: compare with libjpeg's own Y.
  const auto jpeg = encode_jpeg(rgb, 100, ChromaSubsampling::k444);
  EXPECT_LE(max_abs_diff(decode_image(jpeg, "rgb.jpg", 1), luma_of(rgb)), 2);

  const at::Tensor gray = testing::smooth_image(1, 17, 9, 6);
  const auto gray_bytes = encode_png(gray);
  EXPECT_TRUE(decode_image(gray_bytes, "g.png", 1).equal(gray));
  EXPECT_TRUE(decode_image(gray_bytes, "g.png", 3).equal(gray.expand({3, 17, 9})));
  // PNGs ignore the minimum size (no scaled decode).
  EXPECT_EQ(decode_image(bytes, "rgb.png", 3, 5, 5).sizes(), rgb.sizes());

  const ImageInfo info = read_image_info(bytes, "rgb.png");
  EXPECT_EQ(info.format, ImageFormat::kPng);
  EXPECT_EQ(info.height, 21);
  EXPECT_EQ(info.width, 33);
  EXPECT_EQ(info.channels, 3);
  EXPECT_EQ(info.bit_depth, 8);
}

TEST(DecodeTest, PngPalette16BitAlphaAndLowDepthBecomeRgbOrGray) {
  const int w = 5, h = 3;
  // Palette with transparency: indices -> palette colors, alpha dropped.
  RawPng palette;
  palette.width = w;
  palette.height = h;
  palette.color_type = PNG_COLOR_TYPE_PALETTE;
  palette.palette = {{10, 20, 30}, {200, 100, 50}, {7, 250, 128}};
  palette.trns = {255, 0, 128};
  for (int y = 0; y < h; ++y) {
    std::vector<uint8_t> row;
    for (int x = 0; x < w; ++x) row.push_back(static_cast<uint8_t>((x + y) % 3));
    palette.rows.push_back(row);
  }
  const auto palette_bytes = testing::raw_png(palette);
  EXPECT_EQ(read_image_info(palette_bytes, "p.png").channels, 4);
  const at::Tensor p3 = decode_image(palette_bytes, "p.png", 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const png_color c = palette.palette[(x + y) % 3];
      EXPECT_EQ(p3[0][y][x].item<int>(), c.red);
      EXPECT_EQ(p3[1][y][x].item<int>(), c.green);
      EXPECT_EQ(p3[2][y][x].item<int>(), c.blue);
    }
  EXPECT_TRUE(decode_image(palette_bytes, "p.png", 1).equal(luma_of(p3)));

  // 16-bit RGB: the high byte of each sample.
  RawPng deep;
  deep.width = w;
  deep.height = h;
  deep.bit_depth = 16;
  deep.color_type = PNG_COLOR_TYPE_RGB;
  at::Tensor expect = at::empty({3, h, w}, at::kByte);
  for (int y = 0; y < h; ++y) {
    std::vector<uint8_t> row;
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const int v = 1000 * (c + 1) + 7919 * x + 3001 * y;  // < 65536
        row.push_back(static_cast<uint8_t>(v >> 8));
        row.push_back(static_cast<uint8_t>(v & 0xFF));
        expect[c][y][x] = v >> 8;
      }
    deep.rows.push_back(row);
  }
  const auto deep_bytes = testing::raw_png(deep);
  EXPECT_EQ(read_image_info(deep_bytes, "d.png").bit_depth, 16);
  EXPECT_TRUE(decode_image(deep_bytes, "d.png", 3).equal(expect));

  // Gray + alpha: alpha dropped, not composited; RGBA likewise.
  RawPng ga;
  ga.width = w;
  ga.height = h;
  ga.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
  RawPng rgba = ga;
  rgba.color_type = PNG_COLOR_TYPE_RGB_ALPHA;
  at::Tensor ga_expect = at::empty({1, h, w}, at::kByte);
  at::Tensor rgba_expect = at::empty({3, h, w}, at::kByte);
  for (int y = 0; y < h; ++y) {
    std::vector<uint8_t> ga_row, rgba_row;
    for (int x = 0; x < w; ++x) {
      const int g = 40 + 30 * x + 11 * y;
      ga_row.insert(ga_row.end(), {static_cast<uint8_t>(g), static_cast<uint8_t>(x * 50)});
      ga_expect[0][y][x] = g;
      for (int c = 0; c < 3; ++c) {
        rgba_row.push_back(static_cast<uint8_t>(g + 20 * c));
        rgba_expect[c][y][x] = g + 20 * c;
      }
      rgba_row.push_back(static_cast<uint8_t>(y * 60));
    }
    ga.rows.push_back(ga_row);
    rgba.rows.push_back(rgba_row);
  }
  const auto ga_bytes = testing::raw_png(ga), rgba_bytes = testing::raw_png(rgba);
  EXPECT_EQ(read_image_info(ga_bytes, "ga.png").channels, 2);
  EXPECT_EQ(read_image_info(rgba_bytes, "rgba.png").channels, 4);
  EXPECT_TRUE(decode_image(ga_bytes, "ga.png", 1).equal(ga_expect));
  EXPECT_TRUE(decode_image(ga_bytes, "ga.png", 3).equal(ga_expect.expand({3, h, w})));
  EXPECT_TRUE(decode_image(rgba_bytes, "rgba.png", 3).equal(rgba_expect));

  // 1-bit gray: 0 and 1 become 0 and 255. Interlaced (Adam7) RGB decodes like a plain one.
  RawPng bits;
  bits.width = 8;
  bits.height = 2;
  bits.bit_depth = 1;
  bits.color_type = PNG_COLOR_TYPE_GRAY;
  bits.rows = {{0xA5}, {0x0F}};  // 10100101, 00001111
  const at::Tensor b = decode_image(testing::raw_png(bits), "bits.png", 1);
  const std::vector<int> row0 = {255, 0, 255, 0, 0, 255, 0, 255};
  for (int x = 0; x < 8; ++x) {
    EXPECT_EQ(b[0][0][x].item<int>(), row0[x]);
    EXPECT_EQ(b[0][1][x].item<int>(), x < 4 ? 0 : 255);
  }
  RawPng interlaced;
  interlaced.width = 19;
  interlaced.height = 13;
  interlaced.interlaced = true;
  const at::Tensor source = testing::smooth_image(3, 13, 19, 7);
  const at::Tensor hwc = source.permute({1, 2, 0}).contiguous();
  for (int y = 0; y < 13; ++y) {
    const uint8_t* r = hwc.data_ptr<uint8_t>() + y * 19 * 3;
    interlaced.rows.emplace_back(r, r + 19 * 3);
  }
  EXPECT_TRUE(decode_image(testing::raw_png(interlaced), "i.png", 3).equal(source));
}

TEST(DecodeTest, MasksKeepRawIds) {
  RawPng palette;  // VOC-style: palette indices are the class ids
  palette.width = 4;
  palette.height = 2;
  palette.color_type = PNG_COLOR_TYPE_PALETTE;
  palette.palette.assign(256, png_color{0, 0, 0});
  palette.palette[1] = {128, 0, 0};
  palette.palette[255] = {224, 224, 192};
  palette.rows = {{0, 1, 2, 255}, {3, 1, 0, 20}};
  const at::Tensor m = decode_mask(testing::raw_png(palette), "m.png");
  EXPECT_EQ(m.scalar_type(), at::kLong);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{2, 4}));
  const std::vector<int64_t> ids = {0, 1, 2, 255, 3, 1, 0, 20};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(m.view(-1)[i].item<int64_t>(), ids[i]);

  RawPng gray16;  // 16-bit gray ids above 255
  gray16.width = 2;
  gray16.height = 1;
  gray16.bit_depth = 16;
  gray16.color_type = PNG_COLOR_TYPE_GRAY;
  gray16.rows = {{0x01, 0x2C, 0x00, 0x05}};  // 300, 5
  const at::Tensor m16 = decode_mask(testing::raw_png(gray16), "m16.png");
  EXPECT_EQ(m16[0][0].item<int64_t>(), 300);
  EXPECT_EQ(m16[0][1].item<int64_t>(), 5);

  const at::Tensor gray = testing::smooth_image(1, 6, 7);
  EXPECT_TRUE(decode_mask(encode_png(gray), "g.png").equal(gray[0].to(at::kLong)));

  expect_decode_error([] { decode_mask(encode_png(testing::smooth_image(3, 4, 4)), "rgb.png"); },
                      "rgb.png", "gray or palette");
  expect_decode_error([] { decode_mask(encode_jpeg(testing::smooth_image(1, 8, 8), 90), "m.jpg"); },
                      "m.jpg", "not a JPEG");
}

TEST(DecodeTest, BadInputsThrowOneLineNamingTheFile) {
  const auto jpeg = encode_jpeg(testing::smooth_image(3, 64, 64, 8), 90);
  const auto png = encode_png(testing::smooth_image(3, 64, 64, 8));
  auto decode = [](std::vector<uint8_t> bytes, const std::string& path) {
    return [bytes = std::move(bytes), path] { decode_image(bytes, path, 3); };
  };
  expect_decode_error(decode({}, "/d/empty.jpg"), "/d/empty.jpg", "empty file");
  const std::string text = "this is not an image\n";
  expect_decode_error(decode({text.begin(), text.end()}, "/d/text.jpg"), "/d/text.jpg",
                      "not a JPEG or PNG");
  expect_decode_error(decode({jpeg.begin(), jpeg.begin() + jpeg.size() / 2}, "/d/half.jpg"),
                      "/d/half.jpg", "corrupt or truncated JPEG");
  // Cut inside the entropy-coded data of a larger picture: the decoder runs to the end and
  // would paint the rest gray; that is an error, not a picture.
  const auto big = encode_jpeg(testing::smooth_image(3, 256, 256, 8), 90);
  expect_decode_error(decode({big.begin(), big.begin() + big.size() * 3 / 4}, "/d/cut.jpg"),
                      "/d/cut.jpg", "corrupt or truncated JPEG (");
  expect_decode_error(decode({jpeg.begin(), jpeg.begin() + 40}, "/d/head.jpg"), "/d/head.jpg",
                      "JPEG");
  std::vector<uint8_t> corrupt = jpeg;  // garbage over the headers after SOI
  for (size_t i = 3; i < 200; ++i) corrupt[i] = static_cast<uint8_t>(i * 37);
  expect_decode_error(decode(corrupt, "/d/corrupt.jpg"), "/d/corrupt.jpg", "JPEG");
  expect_decode_error(decode({png.begin(), png.begin() + png.size() / 2}, "/d/half.png"),
                      "/d/half.png", "corrupt or truncated PNG");
  expect_decode_error(decode({png.begin(), png.begin() + 8}, "/d/sig.png"), "/d/sig.png", "PNG");
  std::vector<uint8_t> bad_crc = png;  // a flipped byte inside the image data
  bad_crc[bad_crc.size() - 30] ^= 0x5A;
  expect_decode_error(decode(bad_crc, "/d/crc.png"), "/d/crc.png", "corrupt or truncated PNG");
  expect_decode_error([] { read_image_info({}, "/d/empty.png"); }, "/d/empty.png", "empty");
  expect_decode_error(
      [&] {
        read_image_info({png.begin(), png.begin() + 20}, "/d/h.png");
      },
      "/d/h.png", "IHDR");

  EXPECT_THROW(decode_image(jpeg, "x.jpg", 2), InvalidArgument);
  EXPECT_THROW(decode_image(jpeg, "x.jpg", 3, -1, 0), InvalidArgument);
  EXPECT_THROW(encode_jpeg(at::full({3, 4, 4}, 1.0f), 90), InvalidArgument);
  EXPECT_THROW(encode_jpeg(testing::smooth_image(2, 4, 4), 90), InvalidArgument);
  EXPECT_THROW(encode_jpeg(testing::smooth_image(3, 4, 4), 0), InvalidArgument);
  EXPECT_THROW(encode_png(testing::smooth_image(3, 4, 4).view({48})), InvalidArgument);
}

TEST(DecodeTest, AFailedDecodeLeavesTheThreadsHandleUsable) {
  // libjpeg-turbo 2.1 keeps stale marker state in a handle after a corrupt header; the next
  // good file on the same thread must still decode.
  const auto jpeg = encode_jpeg(testing::smooth_image(3, 32, 32, 3), 90);
  const at::Tensor ref = decode_image(jpeg, "ok.jpg", 3);
  std::vector<uint8_t> corrupt = jpeg;
  for (size_t i = 3; i < 200; ++i) corrupt[i] = static_cast<uint8_t>(i * 37);
  const std::vector<std::vector<uint8_t>> bad = {
      corrupt, {jpeg.begin(), jpeg.begin() + 40}, {jpeg.begin(), jpeg.begin() + jpeg.size() / 2}};
  for (const auto& b : bad) {
    EXPECT_THROW(decode_image(b, "bad.jpg", 3), Error);
    EXPECT_THROW(read_image_info(b, "bad.jpg"), Error);
    EXPECT_TRUE(decode_image(jpeg, "ok.jpg", 3).equal(ref));
    EXPECT_EQ(read_image_info(jpeg, "ok.jpg").width, 32);
  }
}

TEST(DecodeTest, ReadFileNamesThePathAndTheSystemError) {
  TempDir dir;
  const std::vector<uint8_t> bytes = {1, 2, 3, 0, 255};
  const std::string path = testing::put(dir, "sub/x.bin", bytes);
  EXPECT_EQ(read_file(path), bytes);
  EXPECT_TRUE(read_file(testing::put(dir, "empty.bin", {})).empty());
  expect_decode_error([&] { read_file(path + ".missing"); }, path + ".missing",
                      "No such file or directory");
  expect_decode_error([&] { read_file(dir.path()); }, dir.path(), "Is a directory");
  expect_decode_error([&] { write_file(testing::join(dir.path(), "no/such/dir/f"), bytes); },
                      "no/such/dir/f", "No such file or directory");
}

TEST(DecodeTest, ReadFileReportsAnUnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permissions are not enforced";
  TempDir dir;
  const std::string path = testing::put(dir, "secret.jpg", {0xFF, 0xD8, 0xFF});
  ::chmod(path.c_str(), 0);
  expect_decode_error([&] { read_file(path); }, path, "Permission denied");
}

TEST(DecodeTest, ConcurrentDecodesMatchASerialOne) {
  const auto jpeg = encode_jpeg(testing::smooth_image(3, 120, 160, 9), 90);
  const auto png = encode_png(testing::smooth_image(3, 50, 70, 9));
  const at::Tensor jpeg_ref = decode_image(jpeg, "a.jpg", 3, 60, 80);
  const at::Tensor png_ref = decode_image(png, "a.png", 1);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 40; ++i) {
        if (!decode_image(jpeg, "a.jpg", 3, 60, 80).equal(jpeg_ref)) ++mismatches;
        if (!decode_image(png, "a.png", 1).equal(png_ref)) ++mismatches;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace tandem::data
