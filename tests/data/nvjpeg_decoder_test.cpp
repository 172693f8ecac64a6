// nvjpeg_decoder.h: availability without a GPU (CPU suite), and on a GPU (NvjpegDecoderGpuTest,
// NvjpegBackendTest; skipped without CUDA or nvJPEG) batched decode of mixed sizes, gray and
// progressive JPEGs to 1 and 3 channels against decode_image on the CPU, the packed layout,
// every bad input naming its file, and each backend (hardware engines, GPU_HYBRID, default)
// on batches large enough for it, reporting which one decoded; the engines reading a pinned
// batch in place.
#include "tandem/data/nvjpeg_decoder.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "fixtures.h"
#include "tandem/data/engine_split.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

using testing::expect_one_line_naming;

// ---- CPU: what a machine without a GPU (or without nvJPEG) is told.

TEST(NvjpegDecoderTest, ReportsWhyNotWithoutDevice) {
  if (tandem::testing::have_cuda()) GTEST_SKIP() << "this machine has a CUDA device";
  std::string why_open, why_available;
  EXPECT_EQ(NvjpegDecoder::open(0, &why_open), nullptr);
  EXPECT_FALSE(NvjpegDecoder::available(&why_available));
  EXPECT_EQ(why_open, why_available);
  // Built with nvjpeg.h, the library is loaded and resolved before the device is asked for,
  // so "no CUDA device" here also says libnvjpeg loaded with every function tandem calls.
  const bool no_device = why_open.find("no CUDA device") != std::string::npos;
  const bool no_header = why_open.find("built without nvjpeg.h") != std::string::npos;
  EXPECT_TRUE(no_device || no_header) << why_open;
  EXPECT_EQ(why_open.find('\n'), std::string::npos) << why_open;
  EXPECT_EQ(NvjpegDecoder::open(0), nullptr);  // why_not is optional
}

// The split's trial times each file's decodes too (the first share ranks them): every file the
// cores reach has its mean time, and the slow one is the slowest.
TEST(DecodeTrialTest, TheCpuTrialTimesEachFile) {
  const testing::TempDir dir;
  for (int i = 0; i < 5; ++i)
    testing::put(dir, "root/c/" + std::to_string(i) + ".jpg",
                 encode_jpeg(testing::smooth_image(3, 64, 80, i), 90));
  const ImageFolderDataset folder(dir.file("root"));
  const DecodeTrial trial(folder, 5, /*jpeg_only=*/true);
  ASSERT_EQ(trial.files.size(), 5u);
  std::vector<double> seconds;
  const double rate = trial.cpu_rate(
      2,
      [&](size_t i) {
        decode_image(trial.files[i], trial.encoded[i].name, 3);
        if (i == 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      },
      &seconds);
  EXPECT_GT(rate, 0);
  ASSERT_EQ(seconds.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_GT(seconds[i], 0) << i;
    if (i != 3) {
      EXPECT_LT(seconds[i], seconds[3]) << i;
    }
  }
  EXPECT_GE(seconds[3], 0.02);
  EXPECT_GT(trial.cpu_rate(2, [](size_t) {}), 0) << "per-file times are optional";
}

TEST(NvjpegDecoderTest, NegativeDeviceIsInvalidArgument) {
  EXPECT_THROW(NvjpegDecoder::open(-1, nullptr), InvalidArgument);
  EXPECT_THROW(NvjpegDecoder::open(-1, nullptr, NvjpegBackend::kHardware), InvalidArgument);
}

TEST(NvjpegDecoderTest, PackedImagesViewsOneSample) {
  PackedImages p;
  p.packed = at::arange(2 * 3 * 4 + 3 * 2 * 2, at::kByte);
  p.offsets_host = {0, 24};
  p.sizes_host = {{2, 3, 4}, {3, 2, 2}};
  ASSERT_EQ(p.size(), 2);
  EXPECT_EQ(p.image(0).sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(p.image(1).sizes().vec(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(p.image(1)[0][0][0].item<int64_t>(), 24);
  EXPECT_EQ(p.image(1)[2][1][1].item<int64_t>(), 35);
  EXPECT_THROW(p.image(2), InvalidArgument);
}

// ---- GPU.

// A decoder on cuda:0 preferring `backend`, or the test skipped with `unavailable` and why.
#define TANDEM_OPEN_DECODER_OR_SKIP(decoder, backend, unavailable)                     \
  TANDEM_SKIP_WITHOUT_CUDA();                                                          \
  std::string why_not_;                                                                \
  std::unique_ptr<NvjpegDecoder> decoder = NvjpegDecoder::open(0, &why_not_, backend); \
  if (!decoder) GTEST_SKIP() << unavailable << ": " << why_not_

#define TANDEM_OPEN_NVJPEG_OR_SKIP(decoder) \
  TANDEM_OPEN_DECODER_OR_SKIP(decoder, NvjpegBackend::kAuto, "nvJPEG unavailable")
// A decoder on the hardware JPEG engines.
#define TANDEM_OPEN_ENGINES_OR_SKIP(decoder) \
  TANDEM_OPEN_DECODER_OR_SKIP(decoder, NvjpegBackend::kHardware, "no JPEG engines")

struct Fixture {
  std::string name;
  std::vector<uint8_t> bytes;
};

// Sizes that are not multiples of the 8 / 16 px blocks, each chroma subsampling, gray, and a
// progressive file.
std::vector<Fixture> good_jpegs() {
  using testing::smooth_image;
  return {
      {"/g/small-420.jpg", encode_jpeg(smooth_image(3, 37, 53, 1), 90)},
      {"/g/wide-444.jpg", encode_jpeg(smooth_image(3, 224, 300, 2), 95, ChromaSubsampling::k444)},
      {"/g/gray.jpg", encode_jpeg(smooth_image(1, 61, 45, 3), 90)},
      {"/g/mid-422.jpg", encode_jpeg(smooth_image(3, 75, 100, 4), 90, ChromaSubsampling::k422)},
      {"/g/progressive.jpg", testing::progressive_jpeg(smooth_image(3, 96, 128, 5))},
  };
}

// `count` baseline color JPEGs of varied sizes (none a multiple of the 16 px block) and the
// three chroma subsamplings: what the hardware engines take, in a batch above GPU_HYBRID's
// threshold of 50 for Huffman decode on the GPU.
std::vector<Fixture> baseline_jpegs(int count, int seed = 0) {
  std::vector<Fixture> out;
  for (int i = 0; i < count; ++i) {
    const int64_t h = 24 + (i * 37 + seed) % 90, w = 30 + (i * 53 + seed) % 110;
    const ChromaSubsampling css = i % 5 == 3   ? ChromaSubsampling::k444
                                  : i % 5 == 4 ? ChromaSubsampling::k422
                                               : ChromaSubsampling::k420;
    out.push_back({"/b/" + std::to_string(seed) + "-" + std::to_string(i) + ".jpg",
                   encode_jpeg(testing::smooth_image(3, h, w, i + seed), 90, css)});
  }
  return out;
}

std::vector<EncodedImage> encoded(const std::vector<Fixture>& fixtures) {
  std::vector<EncodedImage> out;
  for (const auto& f : fixtures) out.push_back({f.bytes.data(), f.bytes.size(), f.name});
  return out;
}

// Decodes on `stream` and checks every sample against decode_image on the CPU (printing each
// sample's differences when `verbose`, else the batch's worst).
void expect_matches_cpu(NvjpegDecoder& decoder, const std::vector<Fixture>& fixtures,
                        int64_t channels, const c10::cuda::CUDAStream& stream,
                        bool verbose = true) {
  const PackedImages out = decoder.decode(encoded(fixtures), channels, stream.stream());
  ASSERT_EQ(out.size(), static_cast<int64_t>(fixtures.size()));
  c10::cuda::CUDAStreamGuard guard(stream);  // reads below are ordered after the decode
  ASSERT_TRUE(out.packed.is_cuda());
  EXPECT_EQ(out.packed.scalar_type(), at::kByte);
  EXPECT_EQ(out.offsets.sizes().vec(), (std::vector<int64_t>{out.size()}));
  EXPECT_EQ(out.sizes.sizes().vec(), (std::vector<int64_t>{out.size(), 3}));
  const at::Tensor offsets = out.offsets.cpu(), sizes = out.sizes.cpu();
  int64_t expected_offset = 0;
  double worst_mean = 0;
  int64_t worst_max = 0;
  for (int64_t b = 0; b < out.size(); ++b) {
    const Fixture& f = fixtures[static_cast<size_t>(b)];
    const at::Tensor cpu = decode_image(f.bytes, f.name, channels);
    const auto& s = out.sizes_host[static_cast<size_t>(b)];
    EXPECT_EQ((std::vector<int64_t>{s[0], s[1], s[2]}), cpu.sizes().vec()) << f.name;
    EXPECT_EQ(out.offsets_host[static_cast<size_t>(b)], expected_offset) << f.name;
    EXPECT_EQ(offsets[b].item<int64_t>(), expected_offset) << f.name;
    for (int k = 0; k < 3; ++k) EXPECT_EQ(sizes[b][k].item<int64_t>(), s[k]) << f.name;
    expected_offset += cpu.numel();
    const at::Tensor gpu = out.image(b).cpu();
    if (gpu.sizes() != cpu.sizes()) continue;
    const at::Tensor diff = gpu.to(at::kInt).sub(cpu.to(at::kInt)).abs();
    const double mean = diff.to(at::kFloat).mean().item<double>();
    const int64_t max = diff.max().item<int64_t>();
    if (verbose)
      std::printf("[ nvjpeg   ] %s -> %lld channel(s): mean |diff| %.3f, max %lld\n",
                  f.name.c_str(), static_cast<long long>(channels), mean,
                  static_cast<long long>(max));
    worst_mean = std::max(worst_mean, mean);
    worst_max = std::max(worst_max, max);
    // A different IDCT and chroma upsampling than libjpeg-turbo's: close, not equal.
    EXPECT_LE(mean, 1.5) << f.name;
    EXPECT_LE(max, 12) << f.name;
  }
  EXPECT_EQ(out.packed.numel(), expected_offset);
  if (!verbose)
    std::printf(
        "[ nvjpeg   ] %zu images -> %lld channel(s) (%s): worst mean |diff| %.3f, "
        "max %lld\n",
        fixtures.size(), static_cast<long long>(channels), decoder.backend(), worst_mean,
        static_cast<long long>(worst_max));
}

TEST(NvjpegDecoderGpuTest, DecodesABatchLikeTheCpuDecoder) {
  TANDEM_OPEN_NVJPEG_OR_SKIP(decoder);
  const auto fixtures = good_jpegs();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  expect_matches_cpu(*decoder, fixtures, 3, side);
  expect_matches_cpu(*decoder, fixtures, 1, side);  // a new output format re-initialises
  // A different batch size on the same decoder, on the default stream, one image at a time.
  for (const auto& f : fixtures)
    expect_matches_cpu(*decoder, {f}, 3, c10::cuda::getDefaultCUDAStream(0));
  expect_matches_cpu(*decoder, fixtures, 3, side);
}

TEST(NvjpegDecoderGpuTest, GrayJpegBecomesThreeEqualChannels) {
  TANDEM_OPEN_NVJPEG_OR_SKIP(decoder);
  const auto bytes = encode_jpeg(testing::smooth_image(1, 40, 30, 6), 90);
  const PackedImages out = decoder->decode({{bytes.data(), bytes.size(), "g.jpg"}}, 3, nullptr);
  const at::Tensor rgb = out.image(0).cpu();
  ASSERT_EQ(rgb.sizes().vec(), (std::vector<int64_t>{3, 40, 30}));
  EXPECT_TRUE(rgb[0].equal(rgb[1]));
  EXPECT_TRUE(rgb[0].equal(rgb[2]));
}

TEST(NvjpegDecoderGpuTest, EmptyBatchGivesEmptyTensors) {
  TANDEM_OPEN_NVJPEG_OR_SKIP(decoder);
  const PackedImages out = decoder->decode({}, 3, nullptr);
  EXPECT_EQ(out.size(), 0);
  EXPECT_EQ(out.packed.numel(), 0);
  EXPECT_EQ(out.sizes.sizes().vec(), (std::vector<int64_t>{0, 3}));
  EXPECT_THROW(decoder->decode({}, 2, nullptr), InvalidArgument);
}

// tandem::Error (not InvalidArgument), one line, naming the file and the cause: alone, and
// among good images (the whole call fails, naming the bad one).
void expect_decode_error(NvjpegDecoder& decoder, const Fixture& bad, const std::string& cause) {
  const auto good = encode_jpeg(testing::smooth_image(3, 32, 32, 7), 90);
  const std::vector<std::vector<EncodedImage>> batches = {
      {{bad.bytes.data(), bad.bytes.size(), bad.name}},
      {{good.data(), good.size(), "/ok/a.jpg"},
       {bad.bytes.data(), bad.bytes.size(), bad.name},
       {good.data(), good.size(), "/ok/b.jpg"}}};
  for (const auto& batch : batches) {
    try {
      decoder.decode(batch, 3, nullptr);
      ADD_FAILURE() << "no error for " << bad.name << " in a batch of " << batch.size();
    } catch (const InvalidArgument& e) {
      ADD_FAILURE() << "InvalidArgument instead of Error: " << e.what();
    } catch (const Error& e) {
      expect_one_line_naming(e.what(), bad.name, cause);
      EXPECT_EQ(std::string(e.what()).find("/ok/"), std::string::npos) << e.what();
    }
  }
}

TEST(NvjpegDecoderGpuTest, BadInputsThrowNamingTheFile) {
  TANDEM_OPEN_NVJPEG_OR_SKIP(decoder);
  const auto jpeg = encode_jpeg(testing::smooth_image(3, 64, 64, 8), 90);
  const auto big = encode_jpeg(testing::smooth_image(3, 256, 256, 8), 90);
  const auto png = encode_png(testing::smooth_image(3, 20, 20, 8));
  const std::string text = "this is not an image\n";
  std::vector<uint8_t> corrupt = jpeg;  // garbage over the headers after SOI
  for (size_t i = 3; i < 200; ++i) corrupt[i] = static_cast<uint8_t>(i * 37);
  std::vector<uint8_t> cmyk(24 * 16 * 4);
  for (size_t i = 0; i < cmyk.size(); ++i) cmyk[i] = static_cast<uint8_t>(i * 7);

  expect_decode_error(*decoder, {"/d/empty.jpg", {}}, "empty file");
  expect_decode_error(*decoder, {"/d/text.jpg", {text.begin(), text.end()}}, "not a JPEG");
  expect_decode_error(*decoder, {"/d/pic.png", png}, "PNG");
  expect_decode_error(*decoder, {"/d/head.jpg", {jpeg.begin(), jpeg.begin() + 40}}, "JPEG");
  expect_decode_error(*decoder, {"/d/corrupt.jpg", corrupt}, "JPEG");
  expect_decode_error(*decoder, {"/d/half.jpg", {jpeg.begin(), jpeg.begin() + jpeg.size() / 2}},
                      "truncated JPEG");
  // Cut inside the entropy-coded data of a larger picture (headers intact).
  expect_decode_error(*decoder, {"/d/cut.jpg", {big.begin(), big.begin() + big.size() * 3 / 4}},
                      "truncated JPEG");
  expect_decode_error(*decoder, {"/d/cmyk.jpg", testing::cmyk_jpeg(cmyk, 24, 16)}, "CMYK");

  // The decoder is still good after all of that.
  expect_matches_cpu(*decoder, good_jpegs(), 3, c10::cuda::getDefaultCUDAStream(0));
}

// kAuto: the hardware engines for a batch they take whole, where the device has them; else
// GPU_HYBRID for a batch above 50; a progressive JPEG (no engine takes it) in a small batch
// goes to the default backend. Batch sizes that change and repeat (re-initialisation, the
// alternating staging buffers growing and being reused) decode right each time.
TEST(NvjpegDecoderGpuTest, ReportsTheBackendThatDecoded) {
  if (std::getenv("TANDEM_NVJPEG_BACKEND") != nullptr)
    GTEST_SKIP() << "TANDEM_NVJPEG_BACKEND is set";
  TANDEM_OPEN_NVJPEG_OR_SKIP(decoder);
  EXPECT_STREQ(decoder->backend(), "none");
  std::printf("[ nvjpeg   ] hardware JPEG decoder: %s\n", decoder->has_hardware() ? "yes" : "no");
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  const char* const large = decoder->has_hardware() ? "hardware" : "hybrid";
  const auto a = baseline_jpegs(64, 1), b = baseline_jpegs(100, 2), c = baseline_jpegs(64, 3);
  for (const auto* batch : {&a, &b, &c, &a}) {
    expect_matches_cpu(*decoder, *batch, 3, side, /*verbose=*/false);
    EXPECT_STREQ(decoder->backend(), large);
  }
  // Gray output: the engines may refuse NVJPEG_OUTPUT_Y, then the batch goes to GPU_HYBRID.
  expect_matches_cpu(*decoder, a, 1, side, /*verbose=*/false);
  const std::string gray = decoder->backend();
  EXPECT_TRUE(gray == large || gray == "hybrid") << gray;
  decoder->decode({}, 3, side.stream());  // an empty batch leaves backend() as it was
  EXPECT_EQ(decoder->backend(), gray);

  expect_matches_cpu(*decoder, good_jpegs(), 3, side);
  const std::string mixed = decoder->backend();
  EXPECT_NE(mixed.find("default"), std::string::npos) << mixed;  // the progressive one
  if (decoder->has_hardware()) {
    EXPECT_NE(mixed.find("hardware"), std::string::npos) << mixed;
  }
}

// A loader batch's JPEG bytes in pinned memory (decode_on_device with the tensor): the engines
// read them in place, with the pixels of a decode from the decoder's own copy; and the block
// is not handed out again before the decode's work is done — a pinned tensor of the same size
// allocated and overwritten right after the call must not reach the pixels.
TEST(NvjpegDecoderGpuTest, EnginesReadAPinnedBatchInPlace) {
  TANDEM_OPEN_ENGINES_OR_SKIP(decoder);
  const auto fixtures = baseline_jpegs(96, 9);
  int64_t total = 0;
  for (const auto& f : fixtures) total += static_cast<int64_t>(f.bytes.size());
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  const c10::Device device(c10::kCUDA, 0);
  const DeviceDecoded copied = decode_on_device(*decoder, encoded(fixtures), device);
  const at::Tensor expected = copied.images.packed.cpu();
  for (int round = 0; round < 3; ++round) {
    at::Tensor bytes = at::empty({total}, pinned);
    std::vector<EncodedImage> in_place;
    int64_t at = 0;
    for (const auto& f : fixtures) {
      std::memcpy(bytes.data_ptr<uint8_t>() + at, f.bytes.data(), f.bytes.size());
      in_place.push_back({bytes.data_ptr<uint8_t>() + at, f.bytes.size(), f.name});
      at += static_cast<int64_t>(f.bytes.size());
    }
    const DeviceDecoded d = decode_on_device(*decoder, in_place, device, bytes);
    EXPECT_STREQ(decoder->backend(), "hardware");
    bytes = at::Tensor();  // freed while the decode may still be reading it
    at::Tensor other = at::empty({total}, pinned);
    other.fill_(0x5a);  // would corrupt the images had the block been handed out again
    EXPECT_TRUE(d.images.packed.cpu().equal(expected)) << "round " << round;
  }
}

// The engines' room grows with the batches they decode — a few small photos, then more rows and
// a larger photo — and never shrinks; every batch, the ones decoded right after the state grew
// (and was initialised again) included, decodes as the CPU decoder does.
TEST(NvjpegDecoderGpuTest, EnginesRoomGrowsWithTheirBatches) {
  TANDEM_OPEN_ENGINES_OR_SKIP(decoder);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  EXPECT_EQ(decoder->engine_room().rows, 0);
  // 8 photos of at most 113 x 139 px: 8 rows and a quarter more, to a multiple of 16; the side
  // to a multiple of 256.
  expect_matches_cpu(*decoder, baseline_jpegs(8, 1), 3, side, false);
  EXPECT_STREQ(decoder->backend(), "hardware");
  EXPECT_EQ(decoder->engine_room().rows, 16) << "nvJPEG 11.4 and later reserve room";
  EXPECT_EQ(decoder->engine_room().side, 256);
  // 40 rows and a portrait photo 700 px high: 40 + 10 rows, to 64; 700 px, to 768.
  auto larger = baseline_jpegs(39, 2);
  larger.push_back({"/b/portrait.jpg", encode_jpeg(testing::smooth_image(3, 700, 300, 7), 90)});
  expect_matches_cpu(*decoder, larger, 3, side, false);
  EXPECT_STREQ(decoder->backend(), "hardware");
  EXPECT_EQ(decoder->engine_room().rows, 64);
  EXPECT_EQ(decoder->engine_room().side, 768);
  // Fewer, smaller photos again: the room stays.
  expect_matches_cpu(*decoder, baseline_jpegs(5, 3), 3, side, false);
  EXPECT_EQ(decoder->engine_room().rows, 64);
  EXPECT_EQ(decoder->engine_room().side, 768);
}

// Each backend asked for by name: the same pixels, layout and errors, and backend() names it
// for a batch of baseline JPEGs above 50. Skipped where that backend is unavailable.
class NvjpegBackendTest : public ::testing::TestWithParam<NvjpegBackend> {};

const char* name_of(NvjpegBackend backend) {
  switch (backend) {
    case NvjpegBackend::kAuto:
      return "auto";
    case NvjpegBackend::kHardware:
      return "hardware";
    case NvjpegBackend::kHybrid:
      return "hybrid";
    case NvjpegBackend::kDefault:
      return "default";
  }
  return "?";
}

TEST_P(NvjpegBackendTest, DecodesLikeTheCpuDecoder) {
  TANDEM_SKIP_WITHOUT_CUDA();
  std::string why_not;
  const std::unique_ptr<NvjpegDecoder> decoder = NvjpegDecoder::open(0, &why_not, GetParam());
  if (!decoder) GTEST_SKIP() << name_of(GetParam()) << " unavailable: " << why_not;
  EXPECT_EQ(decoder->has_hardware(), GetParam() == NvjpegBackend::kHardware);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  const auto large = baseline_jpegs(64, 4);
  for (int64_t channels : {3, 1}) {
    expect_matches_cpu(*decoder, large, channels, side, /*verbose=*/false);
    const std::string used = decoder->backend();
    // Gray output: the engines may refuse NVJPEG_OUTPUT_Y, then the batch goes to GPU_HYBRID.
    if (GetParam() == NvjpegBackend::kHardware && channels == 1) {
      EXPECT_TRUE(used == "hardware" || used == "hybrid") << used;
    } else {
      EXPECT_EQ(used, name_of(GetParam())) << channels << " channel(s)";
    }
  }
  for (int64_t channels : {3, 1}) expect_matches_cpu(*decoder, good_jpegs(), channels, side);
  for (const auto& f : good_jpegs())
    expect_matches_cpu(*decoder, {f}, 3, c10::cuda::getDefaultCUDAStream(0));

  const auto gray = encode_jpeg(testing::smooth_image(1, 40, 30, 6), 90);
  const PackedImages out = decoder->decode({{gray.data(), gray.size(), "g.jpg"}}, 3, nullptr);
  const at::Tensor rgb = out.image(0).cpu();
  EXPECT_TRUE(rgb[0].equal(rgb[1]));
  EXPECT_TRUE(rgb[0].equal(rgb[2]));

  const auto jpeg = encode_jpeg(testing::smooth_image(3, 64, 64, 8), 90);
  expect_decode_error(*decoder, {"/d/half.jpg", {jpeg.begin(), jpeg.begin() + jpeg.size() / 2}},
                      "truncated JPEG");
  expect_decode_error(*decoder, {"/d/head.jpg", {jpeg.begin(), jpeg.begin() + 40}}, "JPEG");
  expect_matches_cpu(*decoder, large, 3, side, /*verbose=*/false);  // still good after those
}

INSTANTIATE_TEST_SUITE_P(Backends, NvjpegBackendTest,
                         ::testing::Values(NvjpegBackend::kHardware, NvjpegBackend::kHybrid,
                                           NvjpegBackend::kDefault),
                         [](const ::testing::TestParamInfo<NvjpegBackend>& backend) {
                           return std::string(name_of(backend.param));
                         });

}  // namespace
}  // namespace tandem::data
