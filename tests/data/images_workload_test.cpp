// Workload "images" end to end on the CPU: an ImageFolder of JPEGs and PNGs written here, decoded
// by the loader's workers at their own sizes, cropped on the device side, a ResNet trained —
// every mode computing serial's losses, a learnable folder learned (accuracy far above chance),
// and bad files stopping the run with the file named or, with skip_bad, left out and reported.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../test_util.h"
#include "fixtures.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/nvjpeg_decoder.h"
#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/resized_crop.h"
#include "tandem/runner.h"
#include "tandem/workloads/images.h"

namespace tandem::data::testing {
namespace {

// Class k of 3: a disk of colour k (red, green, blue) on a gray, noisy background, at a random
// place and size, in an image of random size; every fifth file a PNG.
at::Tensor shape_image(int64_t cls, int64_t h, int64_t w, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor img = at::randint(90, 140, {3, h, w}, g, at::kByte);
  const double r = std::min(h, w) * (0.25 + 0.2 * at::rand({1}, g).item<double>());
  const double cy = h / 2.0 + (at::rand({1}, g).item<double>() - 0.5) * (h - 2 * r);
  const double cx = w / 2.0 + (at::rand({1}, g).item<double>() - 0.5) * (w - 2 * r);
  auto a = img.accessor<uint8_t, 3>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      if ((y - cy) * (y - cy) + (x - cx) * (x - cx) < r * r)
        for (int64_t c = 0; c < 3; ++c) a[c][y][x] = c == cls ? 230 : 30;
  return img;
}

void write_shapes_folder(const TempDir& dir, int per_class, uint64_t seed, bool jpeg_only = false) {
  const char* names[] = {"a_red", "b_green", "c_blue"};  // sorted: label k is colour k
  for (int64_t cls = 0; cls < 3; ++cls)
    for (int i = 0; i < per_class; ++i) {
      const uint64_t s = seed + cls * 1000 + i;
      const int64_t h = 40 + (s * 7) % 50, w = 40 + (s * 13) % 60;
      const at::Tensor img = shape_image(cls, h, w, s);
      const std::string stem = std::string(names[cls]) + "/" + std::to_string(i);
      if (i % 5 == 4 && !jpeg_only)
        put(dir, stem + ".png", encode_png(img));
      else
        put(dir, stem + ".JPG", encode_jpeg(img, 90));
    }
}

WorkloadOptions options_for(const TempDir& dir, const std::string& model, int64_t batch) {
  WorkloadOptions o;
  o.batch_size = batch;
  o.seed = 3;
  o.data = dir.path();
  o.params = {{"model", model}, {"size", "32"}};
  return o;
}

RunOptions run_options(Mode mode, int64_t batch) {
  RunOptions r;
  r.mode = mode;
  r.batch_size = batch;
  r.workers = 2;
  r.seed = 3;
  return r;
}

TEST(ImagesWorkloadTest, EveryModeComputesSerialsLossesOnTheCpu) {
  TempDir dir;
  write_shapes_folder(dir, 6, 1);
  // Crop regions (the default: boxes drawn in the loader's workers, keyed by position), and
  // whole images cropped on the device, with the trained net.
  for (const std::string model : {"r18_full", "r50_frozen_head", "r18_full crop=whole"}) {
    std::vector<float> serial;
    for (const Mode mode : workload_modes()) {
      WorkloadOptions o = options_for(dir, model.substr(0, model.find(' ')), 4);
      if (model.find("crop=whole") != std::string::npos) o.params["crop"] = "whole";
      const ImagesWorkload w = make_images(o);
      if (mode == Mode::kGraphedK) {  // K steps per graph: the eager crop stage cannot be inside
        EXPECT_THROW(Runner(w.workload, run_options(mode, 4)), InvalidArgument);
        continue;
      }
      // 18 images, 4 a batch: 4 batches an epoch; 6 steps cross into a second, reshuffled one.
      const std::vector<float> losses = Runner(w.workload, run_options(mode, 4)).train(6);
      ASSERT_EQ(losses.size(), 6u);
      for (float l : losses) ASSERT_TRUE(std::isfinite(l)) << model << " " << to_string(mode);
      if (mode == Mode::kSerial)
        serial = losses;
      else
        EXPECT_EQ(losses, serial) << model << " " << to_string(mode);
    }
  }
}

// Every mode's losses on the GPU against serial, for these decode settings (and these models,
// with `extra` parameters).
void expect_every_mode_computes_serials_losses(
    const std::vector<std::string>& decodes,
    const std::vector<std::string>& models = {"r18_full", "r50_frozen_head"},
    const std::map<std::string, std::string>& extra = {}) {
  tandem::testing::use_deterministic_algorithms();
  TempDir dir;
  write_shapes_folder(dir, 6, 5, /*jpeg_only=*/true);  // nvJPEG reads JPEGs
  for (const std::string& model : models)
    for (const std::string& decode : decodes) {
      SCOPED_TRACE(model + " decode=" + decode);
      std::vector<float> serial;
      for (const Mode mode : workload_modes()) {
        if (mode == Mode::kGraphedK) continue;  // refused: see the CPU test
        WorkloadOptions o = options_for(dir, model, 4);
        // cpu: whole images, the boxes drawn on the device; region: boxes from the loader's
        // workers; split: half of each batch's samples decoded by the JPEG engines, the other
        // half by the workers (decode=auto with a given share)
        const bool regions = decode == "region" || decode == "split";
        o.params["decode"] = decode == "split" ? "auto" : decode == "region" ? "cpu" : decode;
        o.params["crop"] = regions ? "region" : "whole";
        if (decode == "split") o.params["engine_share"] = "0.5";
        // The split's workers below the engines' feed in priority: the same losses.
        if (decode == "split") o.params["worker_nice"] = "5";
        for (const auto& [key, value] : extra) o.params[key] = value;
        o.device = c10::Device(c10::kCUDA, 0);
        const ImagesWorkload w = make_images(o);
        // 4 batches an epoch; 12 steps: warm-up, capture and replays across three epochs.
        // An exception fails the test naming the model, decode and mode (the trace above).
        std::vector<float> losses;
        try {
          losses = Runner(w.workload, run_options(mode, 4)).train(12);
        } catch (const std::exception& e) {
          FAIL() << to_string(mode) << " threw: " << e.what();
        }
        ASSERT_EQ(losses.size(), 12u);
        std::string text;
        for (float l : losses) text += std::to_string(l) + " ";
        for (float l : losses) EXPECT_TRUE(std::isfinite(l)) << to_string(mode) << ": " << text;
        if (mode == Mode::kSerial)
          serial = losses;
        else
          EXPECT_EQ(losses, serial) << to_string(mode) << ": " << text;
      }
    }
}

// On the GPU: the crop kernel, the packed copy and the graphs, every mode against serial.
TEST(ImagesWorkloadGpuTest, EveryModeComputesSerialsLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  expect_every_mode_computes_serials_losses({"cpu", "region", "split", "gpu"});
}

// fp16 with its loss scale, channels-last (tandem's batch-norm kernels in fp16, the weights cast
// together to fp16, the optimizer skipping overflowed steps on the device): every mode against
// serial, the first steps' overflows included.
TEST(ImagesWorkloadGpuTest, Fp16WithItsLossScaleComputesSerialsLossesInEveryMode) {
  TANDEM_SKIP_WITHOUT_CUDA();
  expect_every_mode_computes_serials_losses({"region"}, {"r18_full"},
                                            {{"precision", "fp16"}, {"layout", "channels_last"}});
}

// The same through nvJPEG's hardware engines (which the pipeline uses only when asked): they
// once wrote a batch before the previous step's graph was done with that memory (mode graphed,
// non-finite losses); now they wait for their stream.
TEST(ImagesWorkloadGpuTest, EveryModeComputesSerialsLossesOnTheJpegEngines) {
  TANDEM_SKIP_WITHOUT_CUDA();
  std::string why_not;
  if (!data::NvjpegDecoder::open(0, &why_not, data::NvjpegBackend::kHardware))
    GTEST_SKIP() << why_not;
  const char* before = std::getenv("TANDEM_NVJPEG_BACKEND");
  const std::string saved = before ? before : "";
  setenv("TANDEM_NVJPEG_BACKEND", "hardware", 1);
  expect_every_mode_computes_serials_losses({"gpu"});
  if (before)
    setenv("TANDEM_NVJPEG_BACKEND", saved.c_str(), 1);
  else
    unsetenv("TANDEM_NVJPEG_BACKEND");
}

// decode=auto with crop regions and no given share, on small images one core decodes by the
// thousand a second: the workers feed the step on their own, and no split is made (the engines'
// host work on the augment stage's thread would cost more than it brings).
TEST(ImagesWorkloadGpuTest, AutoLeavesSmallImagesToTheWorkers) {
  TANDEM_SKIP_WITHOUT_CUDA();
  std::string why_not;
  if (!data::NvjpegDecoder::open(0, &why_not, data::NvjpegBackend::kHardware))
    GTEST_SKIP() << why_not;
  TempDir dir;
  write_shapes_folder(dir, 6, 5, /*jpeg_only=*/true);
  WorkloadOptions o = options_for(dir, "r18_full", 4);
  o.params["decode"] = "auto";
  o.params["crop"] = "region";
  o.device = c10::Device(c10::kCUDA, 0);
  o.workers = 2;
  const ImagesWorkload w = make_images(o);
  ASSERT_EQ(w.workload.feeds.size(), 1u);
  EXPECT_EQ(
      std::count(w.workload.feeds[0].inputs.begin(), w.workload.feeds[0].inputs.end(), "jpeg"), 0)
      << "the loader leaves no sample to the engines";
  Runner runner(w.workload, run_options(Mode::kPipelined, 4));
  const std::vector<float> losses = runner.train(8);
  ASSERT_EQ(losses.size(), 8u);
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(ImagesWorkloadTest, ASmallResNetLearnsColouredShapesFarAboveChance) {
  TempDir dir;
  write_shapes_folder(dir, 24, 2);  // 72 images, 3 classes
  WorkloadOptions o = options_for(dir, "r18_full", 8);
  // 20 epochs at a learning rate the loss settles at (about 0.16): at 10 epochs and 0.02 the
  // loss was still spiking, and the accuracy swung between 0.67 and 1.0 from one CPU to another.
  o.params["lr"] = "0.01";
  const ImagesWorkload w = make_images(o);
  Runner(w.workload, run_options(Mode::kPipelined, 8)).train(180);

  // Evaluate as torchvision would: Resize(36) + CenterCrop(32) of every image, in order.
  ImageFolderOptions fo;
  fo.image_size = 32;
  fo.output = ImageFolderOutput::kDecoded;
  auto folder = std::make_shared<ImageFolderDataset>(dir.path(), fo);
  LoaderOptions lo;
  lo.batch_size = 24;
  lo.workers = 2;
  lo.drop_last = false;
  Loader loader(folder, lo);
  const ResizedCropSpec eval = ResizedCropSpec::eval(32, 36);
  int64_t correct = 0, total = 0;
  while (auto b = loader.next()) {
    const at::Tensor boxes = draw_crop_boxes(eval, b->fields[2]);
    const at::Tensor x = resized_crop(b->fields[0], b->fields[1], b->fields[2], boxes, eval);
    const at::Tensor predicted = w.logits(x).argmax(1);
    correct += predicted.eq(b->fields[3]).sum().item<int64_t>();
    total += x.size(0);
    loader.release(*b);
  }
  ASSERT_EQ(total, 72);
  const double accuracy = static_cast<double>(correct) / total;
  EXPECT_GE(accuracy, 0.8) << "chance is 0.33";
}

TEST(ImagesWorkloadTest, ACorruptFileStopsTheRunNamingItOrIsSkippedAndReported) {
  TempDir dir;
  write_shapes_folder(dir, 4, 3);
  const std::string bad = dir.file("b_green/zz_truncated.jpg");
  std::vector<uint8_t> bytes = encode_jpeg(shape_image(1, 50, 50, 9), 90);
  bytes.resize(bytes.size() / 3);
  write_file(bad, bytes);
  put(dir, "a_red/zz_empty.jpg", {});
  // 12 good files and 2 bad ones: two batches of 7, each with at least 5 good samples (a
  // ResNet in training mode needs more than one sample a batch).
  {
    const ImagesWorkload w = make_images(options_for(dir, "r18_full", 7));
    try {
      Runner(w.workload, run_options(Mode::kSerial, 7)).train(2);
      FAIL() << "no error";
    } catch (const RunError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("zz_truncated.jpg") != std::string::npos ||
                  m.find("zz_empty.jpg") != std::string::npos)
          << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
  const ImagesWorkload w = make_images(options_for(dir, "r18_full", 7));
  RunOptions r = run_options(Mode::kPipelined, 7);
  r.skip_bad = true;
  Runner runner(w.workload, r);
  const std::vector<float> losses = runner.train(2);  // one epoch: every file met once
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  const auto skipped = runner.skipped();
  ASSERT_EQ(skipped.size(), 2u);
  std::string reasons = skipped[0].reason + " | " + skipped[1].reason;
  EXPECT_NE(reasons.find("zz_truncated.jpg"), std::string::npos) << reasons;
  EXPECT_NE(reasons.find("zz_empty.jpg"), std::string::npos) << reasons;
}

TEST(ImagesWorkloadTest, GpuDecodeWithoutAGpuSaysSoAndDecodesOnTheCpu) {
  TempDir dir;
  write_shapes_folder(dir, 3, 6);
  WorkloadOptions o = options_for(dir, "r18_full", 3);
  o.params["decode"] = "gpu";
  ::testing::internal::CaptureStderr();
  const ImagesWorkload gpu = make_images(o);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("decoding on the CPU"), std::string::npos) << said;
  o.params["decode"] = "cpu";
  const ImagesWorkload cpu = make_images(o);
  EXPECT_EQ(Runner(gpu.workload, run_options(Mode::kSerial, 3)).train(2),
            Runner(cpu.workload, run_options(Mode::kSerial, 3)).train(2));
}

TEST(ImagesWorkloadTest, BadSettingsAreNamed) {
  TempDir dir;
  write_shapes_folder(dir, 2, 4);
  auto message = [](const WorkloadOptions& o) {
    try {
      make_images(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  WorkloadOptions o = options_for(dir, "r18_full", 2);
  o.data = "";
  EXPECT_NE(message(o).find("give --data DIR"), std::string::npos);
  o.data = dir.path() + "/a_red/0.JPG";  // a file, not a folder
  EXPECT_NE(message(o).find("0.JPG"), std::string::npos) << message(o);
  o = options_for(dir, "r152", 2);
  EXPECT_NE(message(o).find("r152"), std::string::npos) << message(o);
  o = options_for(dir, "r18_full", 2);
  o.params["size"] = "huge";
  EXPECT_NE(message(o).find("size 'huge'"), std::string::npos) << message(o);
  o = options_for(dir, "r18_full", 2);
  o.params["classes"] = "1";
  EXPECT_NE(message(o).find("classes '1'"), std::string::npos) << message(o);
  o = options_for(dir, "r50_frozen_head", 2);
  o.params["backbone"] = "compiled";
  EXPECT_NE(message(o).find("compiled"), std::string::npos) << message(o);
  o = options_for(dir, "r18_full", 2);
  o.params["weight_casts"] = "fp8";
  EXPECT_NE(message(o).find("weight_casts='fp8'"), std::string::npos) << message(o);
  for (const std::string nice : {"-1", "20", "low"}) {
    o = options_for(dir, "r18_full", 2);
    o.params["worker_nice"] = nice;
    EXPECT_NE(message(o).find("worker_nice '" + nice + "' is not valid: expected 0..19"),
              std::string::npos)
        << message(o);
  }
  o = options_for(dir, "r18_full", 2);
  EXPECT_EQ(make_images(o).workload.data.worker_nice(), 0) << "the process's priority by default";
  o.params["worker_nice"] = "5";
  EXPECT_EQ(make_images(o).workload.data.worker_nice(), 5) << "the loader's workers are told";
}

// Resident batches: the frozen backbone folded (batch norm in the convolutions) trains the head
// as the module in eval mode does, within float rounding; r50_full trains a whole ResNet-50 with
// the head `classes` asks for.
TEST(ImagesWorkloadTest, AFoldedBackboneTrainsTheHeadAsTheModuleDoes) {
  auto losses = [](const std::string& model, const std::string& backbone) {
    WorkloadOptions o;
    o.batch_size = 2;
    o.seed = 3;
    o.params = {{"model", model},
                {"source", "resident"},
                {"size", "32"},
                {"backbone", backbone},
                {"classes", "7"}};
    const ImagesWorkload w = make_images(o);
    EXPECT_EQ(w.classes.size(), 7u);
    return Runner(w.workload, run_options(Mode::kSerial, 2)).train(3);
  };
  const std::vector<float> folded = losses("r50_frozen_head", "folded"),
                           module = losses("r50_frozen_head", "module");
  ASSERT_EQ(folded.size(), 3u);
  for (size_t i = 0; i < folded.size(); ++i)
    EXPECT_NEAR(folded[i], module[i], 1e-4 * std::abs(module[i])) << "step " << i;
  for (float l : losses("r50_full", "folded")) EXPECT_TRUE(std::isfinite(l));
}

}  // namespace
}  // namespace tandem::data::testing
