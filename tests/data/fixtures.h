// Fixtures for the data-layer tests, written at run time (no binary blobs in the repo): a
// temporary folder, deterministic non-constant images, and the files tandem::data's own encoders
// do not write (CMYK JPEGs, palette / 16-bit / alpha / interlaced PNGs, IDX).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <chrono>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "tandem/data/decode.h"

namespace tandem::data::testing {

// No std::filesystem here or in the tests: the PyPI libtorch.so exports its own copies of
// std::filesystem's free functions, and ours bind to them (remove_all crashes). POSIX instead.

/// a + "/" + b.
inline std::string join(const std::string& a, const std::string& b) { return a + "/" + b; }

/// mkdir -p.
inline void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos)
    if (pos == path.size() || path[pos] == '/') ::mkdir(path.substr(0, pos).c_str(), 0755);
}

/// A fresh folder under the test temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/tandem_data_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) {
          ::remove(p);  // best effort: a destructor never throws
          return 0;
        },
        16, FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  /// path() + "/" + relative, with its parent folders created.
  std::string file(const std::string& relative) const {
    const std::string p = join(path_, relative);
    make_dirs(p.substr(0, p.find_last_of('/')));
    return p;
  }

 private:
  std::string path_;
};

/// A smooth, non-constant (C, H, W) uint8 image (gradients + a seed-dependent offset): JPEG
/// keeps it within a few levels, and no two seeds give the same picture.
inline at::Tensor smooth_image(int64_t channels, int64_t height, int64_t width, int seed = 0) {
  at::Tensor t = at::empty({channels, height, width}, at::kByte);
  uint8_t* p = t.data_ptr<uint8_t>();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) {
        const int64_t v = 20 + (c * 23 + seed * 17) % 60 + (c != 1 ? 100 * x / width : 0) +
                          (c != 2 ? 70 * y / height : 0);  // <= 249
        p[(c * height + y) * width + x] = static_cast<uint8_t>(v);
      }
  return t;
}

/// Writes `bytes` to dir/relative and returns the path.
inline std::string put(const TempDir& dir, const std::string& relative,
                       const std::vector<uint8_t>& bytes) {
  const std::string path = dir.file(relative);
  write_file(path, bytes);
  return path;
}

/// TurboJPEG's tjCompress2 of `samples` (interleaved, pixel format `format`); `what` names the
/// kind in the error.
inline std::vector<uint8_t> tj_compress(const uint8_t* samples, int width, int height, int format,
                                        int subsampling, int quality, int flags, const char* what) {
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int status =
      tjCompress2(tj, samples, width, 0, height, format, &jpeg, &size, subsampling, quality, flags);
  std::vector<uint8_t> out;
  if (status == 0) out.assign(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  if (status != 0) throw std::runtime_error(std::string("tjCompress2 (") + what + ") failed");
  return out;
}

/// A CMYK JPEG (TurboJPEG writes it as YCCK, with an Adobe APP14 marker) of (H, W, 4) samples.
inline std::vector<uint8_t> cmyk_jpeg(const std::vector<uint8_t>& cmyk, int width, int height,
                                      int quality = 95) {
  return tj_compress(cmyk.data(), width, height, TJPF_CMYK, TJSAMP_444, quality, 0, "CMYK");
}

/// A progressive JPEG (4:2:0) of a (3, H, W) uint8 image.
inline std::vector<uint8_t> progressive_jpeg(const at::Tensor& rgb, int quality = 90) {
  const at::Tensor hwc = rgb.permute({1, 2, 0}).contiguous();
  return tj_compress(hwc.data_ptr<uint8_t>(), static_cast<int>(rgb.size(2)),
                     static_cast<int>(rgb.size(1)), TJPF_RGB, TJSAMP_420, quality,
                     TJFLAG_PROGRESSIVE, "progressive");
}

/// The PNG the fields describe, written with libpng's full API. `rows` holds height rows of
/// packed samples as PNG stores them (16-bit big-endian, sub-byte depths packed MSB first).
struct RawPng {
  int width = 0, height = 0, bit_depth = 8, color_type = PNG_COLOR_TYPE_RGB;
  bool interlaced = false;
  std::vector<std::vector<uint8_t>> rows;
  std::vector<png_color> palette;  // palette images
  std::vector<uint8_t> trns;       // palette alpha, when not empty
};

namespace detail {
inline void png_append(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
inline void png_no_flush(png_structp) {}
// Only trivial locals in the setjmp frame.
inline bool png_write_all(png_structp png, png_infop info, const RawPng& spec, png_bytepp rows,
                          std::vector<uint8_t>* out) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, out, png_append, png_no_flush);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty())
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (!spec.trns.empty())
    png_set_tRNS(png, info, spec.trns.data(), static_cast<int>(spec.trns.size()), nullptr);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}
}  // namespace detail

inline std::vector<uint8_t> raw_png(const RawPng& spec) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  std::vector<png_bytep> rows;
  for (const auto& row : spec.rows) rows.push_back(const_cast<png_bytep>(row.data()));
  std::vector<uint8_t> out;
  const bool ok = detail::png_write_all(png, info, spec, rows.data(), &out);
  png_destroy_write_struct(&png, &info);
  if (!ok) throw std::runtime_error("libpng write failed");
  return out;
}

/// Runs `f` on a thread of its own and fails the test if it has not returned within `seconds`
/// (the guard of a test of something that must not block). Then it calls `unblock` every 10 ms
/// until `f` returns, so the test ends either way; `f`'s exception, if any, is re-thrown.
template <typename F, typename Unblock>
void expect_returns_within(double seconds, F&& f, Unblock&& unblock) {
  std::future<void> done = std::async(std::launch::async, std::forward<F>(f));
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked after " << seconds << " s";
    while (done.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) unblock();
  }
  done.get();
}

/// A one-line message naming `path`: what every decode error must be.
inline void expect_one_line_naming(const std::string& message, const std::string& path,
                                   const std::string& cause) {
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(cause), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

}  // namespace tandem::data::testing
