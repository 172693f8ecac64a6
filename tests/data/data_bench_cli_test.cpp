// `tandem data-bench` on bad input, run as a user runs it (the binary, its exit status and its
// output): --skip-bad skips a truncated JPEG in every row and says how many; an image + mask
// folder is refused in one line that says what to use; out-of-range options are named. `tandem
// bench` asks CUDA for its most hardware queues where the JPEG engines may decode the folder,
// and only there (hardware_queues.h), and keeps a value the user set. `tandem shrink` writes the
// folder's classes and files again, the large photos smaller, goes on where a run stopped,
// keeps the photos' metadata (or strips it), refuses to write into the folder it reads, and
// names a bad file (or leaves it out).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "fixtures.h"
#include "tandem/data/decode.h"
#include "tandem/data/shrink.h"

namespace tandem::data {
namespace {

using testing::join;
using testing::progressive_jpeg;
using testing::put;
using testing::smooth_image;
using testing::TempDir;

struct Ran {
  int status = -1;     ///< exit status
  std::string output;  ///< stdout and stderr together
};

// The CLI with `arguments` (already shell-quoted where needed), under env(1) with `env` where
// given ("-u VAR", "VAR=value").
// Under timeout(1) when `timeout_s` is given: a hang ends as exit 124.
Ran tandem_cli(const std::string& arguments, const std::string& env = "", int timeout_s = 0) {
  const std::string command = (env.empty() ? "" : "env " + env + " ") +
                              (timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "") +
                              std::string(TANDEM_CLI_PATH) + " " + arguments + " 2>&1";
  Ran ran;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return ran;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) ran.output.append(buffer, n);
  const int status = ::pclose(pipe);
  ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

// data-bench with `arguments`, CPU only and quick: no end-to-end rows.
Ran data_bench(const std::string& arguments) {
  return tandem_cli("data-bench --device cpu --steps 0 " + arguments);
}

// Two classes of small JPEGs, the last of class b cut in half.
std::string folder_with_a_truncated_jpeg(const TempDir& dir, std::string* truncated) {
  for (int i = 0; i < 6; ++i)
    put(dir, std::string("root/") + (i < 3 ? "a/" : "b/") + std::to_string(i) + ".jpg",
        encode_jpeg(smooth_image(3, 40, 48, i), 90));
  const auto good = encode_jpeg(smooth_image(3, 40, 48, 7), 90);
  *truncated = put(dir, "root/b/9_truncated.jpg", {good.begin(), good.begin() + good.size() / 2});
  return join(dir.path(), "root");
}

TEST(DataBenchCliTest, SkipBadSkipsATruncatedJpegInTheDecodeAndLoaderRows) {
  TempDir dir;
  std::string truncated;
  const std::string root = folder_with_a_truncated_jpeg(dir, &truncated);

  const Ran failed = data_bench("--data " + root + " --images 20 --workers 1 --batch-size 2");
  EXPECT_EQ(failed.status, 1) << failed.output;
  EXPECT_NE(failed.output.find(truncated), std::string::npos) << failed.output;

  const Ran ran =
      data_bench("--data " + root + " --images 20 --workers 1 --batch-size 2 --skip-bad");
  ASSERT_EQ(ran.status, 0) << ran.output;
  EXPECT_NE(ran.output.find("note: decode rows: 1 bad file(s) left out (--skip-bad): " + truncated),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("1 bad file(s) skipped"), std::string::npos) << ran.output;  // loader
  for (const char* row : {"turbojpeg_scaled", "turbojpeg_region", "turbojpeg_center"})
    EXPECT_NE(ran.output.find(row), std::string::npos) << row << ": " << ran.output;
  // Photos of 40 x 48: nothing for tandem shrink to do, and nothing said of it.
  EXPECT_EQ(ran.output.find("tandem shrink"), std::string::npos) << ran.output;
}

TEST(DataBenchCliTest, ANamedPipeAmongThePhotosIsNamedNeverOpened) {
  // The photo-size survey before the rows once opened it and waited for a writer forever: under
  // timeout(1) a hang is exit 124, not a stuck test.
  TempDir dir;
  std::string truncated;
  const std::string root = folder_with_a_truncated_jpeg(dir, &truncated);
  ASSERT_EQ(std::remove(truncated.c_str()), 0);
  const std::string fifo = join(root, "a/0_pipe.jpg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string args = "--data " + root + " --images 20 --workers 1 --batch-size 2";
  const Ran failed = tandem_cli("data-bench --device cpu --steps 0 " + args, "", 120);
  EXPECT_EQ(failed.status, 1) << failed.output;
  EXPECT_NE(failed.output.find(fifo + ": not a regular file: a named pipe"), std::string::npos)
      << failed.output;
  const Ran skipped = tandem_cli("data-bench --device cpu --steps 0 --skip-bad " + args, "", 120);
  EXPECT_EQ(skipped.status, 0) << skipped.output;
  EXPECT_NE(skipped.output.find(fifo), std::string::npos) << skipped.output;
}

// Without --workers the loader row runs the run layer's one default (default_loader_workers: 2
// on the CPU), the count tandem train and tandem bench would start, not a rule of its own.
TEST(DataBenchCliTest, TheLoaderRowRunsTheWorkersATrainingWould) {
  TempDir dir;
  std::string truncated;
  const std::string root = folder_with_a_truncated_jpeg(dir, &truncated);
  ASSERT_EQ(std::remove(truncated.c_str()), 0);
  const Ran ran = data_bench("--data " + root + " --images 4 --loader-images 6 --batch-size 2");
  ASSERT_EQ(ran.status, 0) << ran.output;
  const size_t row = ran.output.find("\nloader ");
  ASSERT_NE(row, std::string::npos) << ran.output;
  char job[32], decode[32], batch[16];
  int workers = 0;
  ASSERT_EQ(
      std::sscanf(ran.output.c_str() + row + 1, "%31s %31s %15s %d", job, decode, batch, &workers),
      4)
      << ran.output;
  EXPECT_EQ(workers, 2) << ran.output;
}

TEST(DataBenchCliTest, APhotoTooLargeForAWholeDecodeIsLeftOutOfTheFullSizeRowsAlone) {
  // 20000 x 20000 pixels: training decodes its crops at 1/8 scale, the full-size row cannot.
  TempDir dir;
  std::string truncated;
  const std::string root = folder_with_a_truncated_jpeg(dir, &truncated);
  ASSERT_EQ(std::remove(truncated.c_str()), 0);
  const std::string large =
      put(dir, "root/b/large.jpg", encode_jpeg(at::full({1, 20000, 20000}, 128, at::kByte), 50));
  const Ran ran =
      data_bench("--data " + root + " --images 20 --loader-images 14 --workers 1 --batch-size 2");
  ASSERT_EQ(ran.status, 0) << ran.output;
  EXPECT_NE(ran.output.find("full-size decode rows: 1 of the 7 files left out, larger than a "
                            "whole decode takes"),
            std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find(large), std::string::npos) << ran.output;
  for (const char* row : {"turbojpeg_scaled", "turbojpeg_region", "turbojpeg_full"})
    EXPECT_NE(ran.output.find(row), std::string::npos) << row << ": " << ran.output;
}

// `tandem bench` of workload images on `root` in the environment `env` (a prefix for env(1)):
// the hardware queues its request reports.
std::string queues_of_bench(const std::string& env, const std::string& root,
                            const std::string& more) {
  const Ran ran = tandem_cli("bench --workload images --device cpu --data " + root +
                                 " --batch-size 2 --steps 1 --warmup 0 --workers 1 " + more,
                             env);
  if (ran.status != 0) return "failed: " + ran.output;
  const std::string key = "hardware queues ";
  const size_t at = ran.output.find(key);
  if (at == std::string::npos) return "no '" + key + "' line: " + ran.output;
  return ran.output.substr(at + key.size(),
                           ran.output.find(' ', at + key.size()) - at - key.size());
}

TEST(DataBenchCliTest, BenchAsksForMoreHardwareQueuesWhereTheEnginesMayDecode) {
  TempDir dir;
  for (int i = 0; i < 4; ++i)
    put(dir, std::string("root/") + (i < 2 ? "a/" : "b/") + std::to_string(i) + ".jpg",
        encode_jpeg(smooth_image(3, 40, 48, i), 90));
  const std::string root = join(dir.path(), "root");
  const std::string unset = "-u CUDA_DEVICE_MAX_CONNECTIONS";
  EXPECT_EQ(queues_of_bench(unset, root, "--decode auto"), "32");
  EXPECT_EQ(queues_of_bench(unset, root, "--param decode=gpu"), "32");
  EXPECT_EQ(queues_of_bench(unset, root, ""), "8") << "the workers alone, the default";
  EXPECT_EQ(queues_of_bench(unset, root, "--decode cpu"), "8");
  EXPECT_EQ(queues_of_bench(unset, root, "--decode cpu --param decode=auto"), "8")
      << "--decode over --param, as the run gets them";
  EXPECT_EQ(queues_of_bench(unset, root, "--param decode=auto --param decode=cpu"), "8")
      << "the later --param";
  EXPECT_EQ(queues_of_bench("CUDA_DEVICE_MAX_CONNECTIONS=4", root, "--decode auto"), "4")
      << "the user's";
}

TEST(DataBenchCliTest, AnImageMaskFolderIsRefusedInOneLineSayingWhatToUse) {
  TempDir dir;
  put(dir, "seg/images/a.jpg", encode_jpeg(smooth_image(3, 16, 16, 1), 90));
  put(dir, "seg/masks/a.png", encode_png(smooth_image(1, 16, 16, 2).gt(100).to(at::kByte)));
  const std::string root = join(dir.path(), "seg");
  const Ran ran = data_bench("--data " + root);
  EXPECT_EQ(ran.status, 2) << ran.output;
  EXPECT_EQ(ran.output,
            "tandem: error: data-bench reads an ImageFolder (one subfolder of images per class); " +
                root +
                " holds images/ and masks/ (segmentation pairs), which it would read as "
                "two classes: time reading it with tandem train --data " +
                root + " (its progress gives img/s)\n");
}

TEST(DataBenchCliTest, OutOfRangeOptionsAreNamedInOneLine) {
  TempDir dir;
  std::string truncated;
  const std::string root = folder_with_a_truncated_jpeg(dir, &truncated);
  for (const auto& [flag, message] :
       {std::pair{"--workers 0", "--workers 0 is not valid: expected 1 to"},
        std::pair{"--images 0", "--images 0 is not valid: expected >= 1"},
        std::pair{"--batch-size -3", "--batch-size -3 is not valid: expected >= 1"}}) {
    const Ran ran = data_bench("--data " + root + " " + flag);
    EXPECT_EQ(ran.status, 2) << flag << ": " << ran.output;
    EXPECT_EQ(ran.output.rfind(std::string("tandem: error: ") + message, 0), 0u)
        << flag << ": " << ran.output;
    EXPECT_EQ(ran.output.find('\n'), ran.output.size() - 1) << flag << ": " << ran.output;
  }
}

// A JPEG with a comment segment after its JFIF header: metadata that shrink carries over.
std::vector<uint8_t> with_comment(const std::vector<uint8_t>& jpeg, const std::string& text) {
  const size_t after_jfif = 4 + ((size_t{jpeg[4]} << 8) | jpeg[5]), length = text.size() + 2;
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + static_cast<long>(after_jfif));
  for (const uint8_t b : {size_t{0xFF}, size_t{0xFE}, length >> 8, length & 0xFF})
    out.push_back(static_cast<uint8_t>(b));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), jpeg.begin() + static_cast<long>(after_jfif), jpeg.end());
  return out;
}

bool contains(const std::vector<uint8_t>& bytes, const std::string& text) {
  return std::search(bytes.begin(), bytes.end(), text.begin(), text.end()) != bytes.end();
}

// A folder of two classes: two photos and a PNG too large for 64 px crops (one photo with a
// comment), a small photo and a small progressive one.
std::string folder_to_shrink(const TempDir& dir) {
  put(dir, "root/a/big1.jpg",
      with_comment(encode_jpeg(smooth_image(3, 600, 800, 1), 95), "from the camera"));
  put(dir, "root/a/small.jpg", encode_jpeg(smooth_image(3, 100, 120, 2), 95));
  put(dir, "root/b/deep/big2.jpg", encode_jpeg(smooth_image(3, 800, 600, 3), 95));
  put(dir, "root/b/pic.png", encode_png(smooth_image(3, 500, 500, 4)));
  put(dir, "root/b/prog.jpg", progressive_jpeg(smooth_image(3, 100, 120, 5)));
  return join(dir.path(), "root");
}

TEST(ShrinkCliTest, WritesTheFolderAgainWithTheLargePhotosSmallerAndGoesOnWhereItStopped) {
  TempDir dir;
  const std::string root = folder_to_shrink(dir), out = join(dir.path(), "small");
  const std::string args = "shrink --quiet --image-size 64 --data " + root + " --out " + out;
  const Ran ran = tandem_cli(args + " --json " + join(dir.path(), "s.json"));
  ASSERT_EQ(ran.status, 0) << ran.output;
  // 64 px crops of scale 0.08 keep 68,267 px of area (shorter side 74): 600 x 800 -> 227 x 302.
  const ImageInfo big1 = read_image_info(read_file(join(out, "a/big1.jpg")), "big1");
  EXPECT_EQ(big1.height, 227);
  EXPECT_EQ(big1.width, 302);
  EXPECT_EQ(read_image_info(read_file(join(out, "b/deep/big2.jpg")), "big2").height, 302);
  EXPECT_EQ(read_file(join(out, "a/small.jpg")), read_file(join(root, "a/small.jpg")));
  const ImageInfo pic = read_image_info(read_file(join(out, "b/pic.png")), "pic");
  EXPECT_EQ(pic.format, ImageFormat::kPng);  // a PNG stays a PNG, smaller
  EXPECT_EQ((std::array<int64_t, 2>{pic.height, pic.width}), shrunk_shape(500, 500, kept_size(64)));
  EXPECT_NE(ran.output.find("shrunk                      3"), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("copied as they were         1  (small enough 1)"), std::string::npos)
      << ran.output;
  EXPECT_NE(ran.output.find("made baseline               1"), std::string::npos) << ran.output;
  const std::vector<uint8_t> prog = read_file(join(out, "b/prog.jpg"));
  EXPECT_FALSE(read_image_info(prog, "prog").progressive);
  EXPECT_TRUE(decode_image(prog, "prog", 3)
                  .equal(decode_image(read_file(join(root, "b/prog.jpg")), "prog", 3)));
  const std::vector<uint8_t> json_bytes = read_file(join(dir.path(), "s.json"));
  const std::string json(json_bytes.begin(), json_bytes.end());
  EXPECT_NE(json.find("\"min_area\": 68267"), std::string::npos) << json;
  EXPECT_NE(json.find("\"metadata\": \"kept\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"made_baseline\": 1"), std::string::npos) << json;
  EXPECT_TRUE(contains(read_file(join(out, "a/big1.jpg")), "from the camera"));
  const std::string bare = join(dir.path(), "bare");
  const Ran stripped = tandem_cli("shrink --quiet --image-size 64 --strip-metadata --data " + root +
                                  " --out " + bare);
  ASSERT_EQ(stripped.status, 0) << stripped.output;
  EXPECT_FALSE(contains(read_file(join(bare, "a/big1.jpg")), "from the camera"));
  EXPECT_EQ(read_image_info(read_file(join(bare, "a/big1.jpg")), "big1").height, 227);

  // A run stopped half way: what is there is kept, the rest written.
  ASSERT_EQ(std::remove(join(out, "b/deep/big2.jpg").c_str()), 0);
  const Ran again = tandem_cli(args);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("shrunk                      1"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("already there               4"), std::string::npos) << again.output;
  EXPECT_EQ(read_image_info(read_file(join(out, "b/deep/big2.jpg")), "big2").height, 302);

  // An output damaged since (cut short, emptied) is written again, not counted as done.
  const std::vector<uint8_t> whole = read_file(join(out, "b/deep/big2.jpg"));
  write_file(join(out, "b/deep/big2.jpg"),
             std::vector<uint8_t>(whole.begin(), whole.begin() + whole.size() / 2));
  write_file(join(out, "a/big1.jpg"), {});
  const Ran third = tandem_cli(args);
  ASSERT_EQ(third.status, 0) << third.output;
  EXPECT_NE(third.output.find("already there               3"), std::string::npos) << third.output;
  EXPECT_NE(third.output.find("written again               2  (damaged since an earlier run: "),
            std::string::npos)
      << third.output;
  EXPECT_EQ(read_file(join(out, "b/deep/big2.jpg")), whole);
  EXPECT_EQ(read_image_info(read_file(join(out, "a/big1.jpg")), "big1").height, 227);
}

TEST(ShrinkCliTest, RefusesToWriteIntoTheFolderItReadsAndNamesABadFile) {
  TempDir dir;
  const std::string root = folder_to_shrink(dir);
  const Ran inside = tandem_cli("shrink --quiet --data " + root + " --out " + root + "/small");
  EXPECT_EQ(inside.status, 2) << inside.output;
  EXPECT_NE(inside.output.find("is inside --data"), std::string::npos) << inside.output;
  const Ran above = tandem_cli("shrink --quiet --data " + root + " --out " + dir.path());
  EXPECT_EQ(above.status, 2) << above.output;
  EXPECT_NE(above.output.find("is above --data"), std::string::npos) << above.output;
  const Ran quality = tandem_cli("shrink --quiet --data " + root + " --out " +
                                 join(dir.path(), "q") + " --quality 0");
  EXPECT_EQ(quality.status, 2) << quality.output;
  EXPECT_NE(quality.output.find("--quality 0 is not valid: expected 1 to 100"), std::string::npos)
      << quality.output;

  const auto good = encode_jpeg(smooth_image(3, 600, 800, 7), 90);
  const std::string cut =
      put(dir, "root/b/cut.jpg", {good.begin(), good.begin() + good.size() / 2});
  const std::string out = join(dir.path(), "small");
  const Ran failed = tandem_cli("shrink --quiet --workers 1 --data " + root + " --out " + out);
  EXPECT_EQ(failed.status, 1) << failed.output;
  EXPECT_NE(failed.output.find(cut), std::string::npos) << failed.output;
  const Ran skipped = tandem_cli("shrink --quiet --skip-bad --data " + root + " --out " + out);
  ASSERT_EQ(skipped.status, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("bad, left out               1  (" + cut), std::string::npos)
      << skipped.output;
  EXPECT_EQ(read_file(join(out, "a/big1.jpg")), read_file(join(root, "a/big1.jpg")));  // 224 px
  EXPECT_EQ(::access(join(out, "b/cut.jpg").c_str(), F_OK), -1);
}

}  // namespace
}  // namespace tandem::data
