// Files that are not regular files in a data folder (a named pipe, a socket): the listing never
// opens them and their load never blocks; each is a bad sample named with its path and kind,
// which stops the loader or, with skip_bad, is skipped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "fixtures.h"
#include "tandem/data/decode.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/image_mask_pairs.h"
#include "tandem/data/shrink.h"
#include "tandem/error.h"
#include "tandem/loader.h"

namespace tandem::data {
namespace {

using testing::join;
using testing::put;
using testing::smooth_image;
using testing::TempDir;

// Lets a reader blocked in open() of the FIFO go (the bug these tests guard against): opening
// the write end without blocking succeeds only while a reader waits.
void open_write_end(const std::string& fifo) {
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
}

std::string make_fifo(const TempDir& dir, const std::string& relative) {
  const std::string path = dir.file(relative);
  if (::mkfifo(path.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed");
  return path;
}

// A listening-free AF_UNIX socket bound at `relative` (the file stays after close).
std::string make_socket(const TempDir& dir, const std::string& relative) {
  const std::string path = dir.file(relative);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) throw std::runtime_error("socket path too long");
  std::strcpy(address.sun_path, path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const int bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  ::close(fd);
  if (bound != 0) throw std::runtime_error("bind failed");
  return path;
}

// Drains a loader; returns the LoaderError's message ("" if none).
std::string drain(Loader& loader) {
  try {
    while (auto batch = loader.next()) loader.release(*batch);
  } catch (const LoaderError& e) {
    return e.what();
  }
  return "";
}

TEST(SpecialFilesTest, ReadFileNamesANamedPipeOrSocketWithoutBlocking) {
  TempDir dir;
  const std::string fifo = make_fifo(dir, "fifo.jpg");
  const std::string socket = make_socket(dir, "sock.png");
  for (const auto& [path, kind] : {std::pair{fifo, "not a regular file: a named pipe"},
                                   std::pair{socket, "not a regular file: a socket"}}) {
    testing::expect_returns_within(
        5,
        [&, path = path, kind = kind] {
          try {
            read_file(path);
            ADD_FAILURE() << "no error for " << path;
          } catch (const Error& e) {
            testing::expect_one_line_naming(e.what(), path, kind);
          }
        },
        [&] { open_write_end(fifo); });
  }
  // A symlink to a regular file still reads.
  const std::vector<uint8_t> bytes{1, 2, 3};
  const std::string target = put(dir, "real.jpg", bytes);
  ASSERT_EQ(::symlink(target.c_str(), join(dir.path(), "link.jpg").c_str()), 0);
  EXPECT_EQ(read_file(join(dir.path(), "link.jpg")), bytes);
}

TEST(SpecialFilesTest, ImageFolderNamesAFifoAndSkipBadSkipsIt) {
  TempDir dir;
  const std::string root = join(dir.path(), "root");
  put(dir, "root/a/0_good.jpg", encode_jpeg(smooth_image(3, 24, 24, 1), 90));
  const std::string fifo = make_fifo(dir, "root/a/1_fifo.jpg");
  put(dir, "root/b/2_good.png", encode_png(smooth_image(3, 20, 20, 2)));
  std::shared_ptr<ImageFolderDataset> ds;
  testing::expect_returns_within(
      5,
      [&] {
        ds = std::make_shared<ImageFolderDataset>(root, ImageFolderOptions{16, 3});
      },
      [&] { open_write_end(fifo); });
  ASSERT_TRUE(ds);
  ASSERT_EQ(ds->size(), 3);  // listed, as torchvision lists it: its load names it
  EXPECT_EQ(ds->samples()[1].path, fifo);

  LoaderOptions options;
  options.batch_size = 3;
  options.workers = 2;
  options.pin_memory = false;
  testing::expect_returns_within(
      5,
      [&] {
        Loader loader(ds, options);
        const std::string error = drain(loader);
        EXPECT_NE(error.find("sample 1"), std::string::npos) << error;
        testing::expect_one_line_naming(error, fifo, "not a regular file: a named pipe");
      },
      [&] { open_write_end(fifo); });

  options.skip_bad = true;
  testing::expect_returns_within(
      5,
      [&] {
        Loader loader(ds, options);
        int64_t samples = 0;
        while (auto batch = loader.next()) {
          samples += static_cast<int64_t>(batch->indices.size());
          loader.release(*batch);
        }
        EXPECT_EQ(samples, 2);
        const auto skipped = loader.skipped();
        ASSERT_EQ(skipped.size(), 1u);
        EXPECT_EQ(skipped[0].index, 1);
        testing::expect_one_line_naming(skipped[0].reason, fifo, "a named pipe");
      },
      [&] { open_write_end(fifo); });
}

TEST(SpecialFilesTest, ThePhotoSizeSurveyNeverOpensAFifo) {
  // tandem train and data-bench survey a folder's headers before the loader starts: a FIFO
  // there is left out of the survey (the run names it), never waited on.
  TempDir dir;
  const std::string root = join(dir.path(), "root");
  put(dir, "root/a/0_good.jpg", encode_jpeg(smooth_image(3, 24, 32, 1), 90));
  const std::string fifo = make_fifo(dir, "root/a/1_fifo.jpg");
  put(dir, "root/b/2_good.png", encode_png(smooth_image(3, 20, 20, 2)));
  const ImageFolderDataset ds(root, ImageFolderOptions{16, 3});
  PhotoSizes sizes;
  testing::expect_returns_within(
      5, [&] { sizes = survey_photo_sizes(ds, kept_size(16)); }, [&] { open_write_end(fifo); });
  EXPECT_EQ(sizes.sampled, 2);  // the two photos, not the pipe
}

TEST(SpecialFilesTest, ImageMaskPairsNamesAFifoMaskAndSkipBadSkipsIt) {
  TempDir dir;
  const std::string root = join(dir.path(), "root");
  const auto image = encode_jpeg(smooth_image(3, 24, 24, 1), 90);
  const auto mask = encode_png(smooth_image(1, 24, 24, 3).gt(100).to(at::kByte));  // ids 0, 1
  put(dir, "root/images/a.jpg", image);
  put(dir, "root/masks/a.png", mask);
  put(dir, "root/images/b.jpg", image);
  const std::string fifo = make_fifo(dir, "root/masks/b.png");
  EXPECT_TRUE(is_image_mask_pairs_folder(root));
  auto pairs = std::make_shared<ImageMaskPairs>(root, ImageMaskPairsOptions{16, 2, 255});
  ASSERT_EQ(pairs->size(), 2);
  EXPECT_EQ(pairs->sample_source(1), join(root, "images/b.jpg"));

  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 1;
  options.pin_memory = false;
  testing::expect_returns_within(
      5,
      [&] {
        Loader loader(pairs, options);
        testing::expect_one_line_naming(drain(loader), fifo, "not a regular file: a named pipe");
      },
      [&] { open_write_end(fifo); });
  options.skip_bad = true;
  testing::expect_returns_within(
      5,
      [&] {
        Loader loader(pairs, options);
        EXPECT_EQ(drain(loader), "");
        ASSERT_EQ(loader.skipped().size(), 1u);
        EXPECT_EQ(loader.skipped()[0].index, 1);
      },
      [&] { open_write_end(fifo); });
}

}  // namespace
}  // namespace tandem::data
