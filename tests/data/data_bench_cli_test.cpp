// `tandem data-bench` on bad input, run as a user runs it (the binary, its exit status and its
// output): --skip-bad skips a truncated JPEG in every row and says how many; an image + mask
// folder is refused in one line that says what to use; out-of-range options are named. `tandem
// bench` asks CUDA for its most hardware queues where the JPEG engines may decode the folder,
// and only there (hardware_queues.h), and keeps a value the user set.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "fixtures.h"
#include "tandem/data/decode.h"

namespace tandem::data {
namespace {

using testing::join;
using testing::put;
using testing::smooth_image;
using testing::TempDir;

struct Ran {
  int status = -1;     ///< exit status
  std::string output;  ///< stdout and stderr together
};

// The CLI with `arguments` (already shell-quoted where needed), under env(1) with `env` where
// given ("-u VAR", "VAR=value").
Ran tandem_cli(const std::string& arguments, const std::string& env = "") {
  const std::string command = (env.empty() ? "" : "env " + env + " ") +
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
  EXPECT_NE(ran.output.find("turbojpeg_scaled"), std::string::npos) << ran.output;
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

}  // namespace
}  // namespace tandem::data
