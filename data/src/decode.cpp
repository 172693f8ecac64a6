// Format sniffing, file reading, and the JPEG half of decode.h through the TurboJPEG API: one
// decompressor and one compressor handle per thread, scaled decode by powers of two (with the
// fast IDCT and upsampling when a minimum size says the image will be resized), CMYK / YCCK
// converted by hand (TurboJPEG decodes those only to CMYK).
#include "tandem/data/decode.h"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <sys/stat.h>
#ifndef TANDEM_DATA_NO_TURBOJPEG
#include <turbojpeg.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <system_error>

#include "codec_util.h"
#include "jpeg_markers.h"
#include "jpeg_window.h"
#include "posix_fs.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

using detail::fail;

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

std::string errno_message(int code) {
  return std::error_code(code, std::generic_category()).message();
}

// The arguments every decode takes: 1 or 3 channels, minimum sizes >= 0.
void check_decode_args(int64_t channels, int64_t min_height, int64_t min_width,
                       const std::string& path, const char* what) {
  TANDEM_CHECK_ARG(channels == 1 || channels == 3, what, "(", path,
                   "): channels must be 1 (gray) or 3 (RGB), got ", channels);
  TANDEM_CHECK_ARG(min_height >= 0 && min_width >= 0, what, "(", path,
                   "): minimum size must be >= 0, got ", min_height, " x ", min_width);
}

// A box of at least one pixel, inside an image of height x width.
void check_box_inside(const PixelBox& box, int64_t height, int64_t width, const std::string& path) {
  TANDEM_CHECK_ARG(box.height >= 1 && box.width >= 1 && box.top >= 0 && box.left >= 0 &&
                       box.top + box.height <= height && box.left + box.width <= width,
                   "decode_image_region: box (top ", box.top, ", left ", box.left, ", ", box.height,
                   " x ", box.width, ") is not inside ", path, " (", height, " x ", width, ")");
}

#ifndef TANDEM_DATA_NO_TURBOJPEG
// A TurboJPEG handle owned by one thread (handles are not thread-safe; creating one per image
// costs ~tens of microseconds and a few allocations, so each worker keeps its own).
//
// Hazard: after a failed call the handle is not reliably reusable — libjpeg-turbo 2.1's
// tjDecompressHeader3 bails out of a corrupt header without aborting the decompressor, and the
// next header read continues from the stale marker state ("Unsupported marker type", or a
// 0 x 0 "success"). So every failure path calls reset() before throwing.
class TjHandle {
 public:
  enum class Kind { kDecompress, kCompress, kTransform };
  explicit TjHandle(Kind kind) : kind_(kind), handle_(create(kind)) {}
  ~TjHandle() {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  tjhandle get() const { return handle_; }
  /// The last error's text, then a fresh handle in place of this one.
  std::string error_and_reset() {
    std::string message = tjGetErrorStr2(handle_);
    tjhandle fresh = create(kind_);  // throws, leaving this handle as it was
    tjDestroy(handle_);
    handle_ = fresh;
    return message;
  }

 private:
  static tjhandle create(Kind kind) {
    tjhandle h = kind == Kind::kDecompress ? tjInitDecompress()
                 : kind == Kind::kCompress ? tjInitCompress()
                                           : tjInitTransform();
    if (h == nullptr)
      throw Error(std::string("TurboJPEG: cannot create a handle: ") + tjGetErrorStr2(nullptr));
    return h;
  }
  Kind kind_;
  tjhandle handle_;
};

TjHandle& decompressor() {
  thread_local TjHandle handle(TjHandle::Kind::kDecompress);
  return handle;
}

TjHandle& compressor() {
  thread_local TjHandle handle(TjHandle::Kind::kCompress);
  return handle;
}

// TurboJPEG reports a call that ran to the end but met bad data as a warning. A premature end
// (truncated file: the rest is painted gray) or corrupt entropy data yields wrong pixels, so
// those fail; only "extraneous bytes before marker" — a few junk bytes between segments, common
// in real photo collections and harmless (PIL loads them) — is let through.
bool is_harmless_warning(bool warning, const std::string& message) {
  return warning && message.find("extraneous bytes") != std::string::npos;
}

struct JpegHeader {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
};

JpegHeader read_jpeg_header(const std::vector<uint8_t>& bytes, const std::string& path) {
  JpegHeader h;
  TjHandle& tj = decompressor();
  if (tjDecompressHeader3(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()),
                          &h.width, &h.height, &h.subsampling, &h.colorspace) != 0) {
    const bool warning = tjGetErrorCode(tj.get()) == TJERR_WARNING;
    const std::string message = tj.error_and_reset();
    if (!is_harmless_warning(warning, message))
      fail(path, "corrupt or truncated JPEG header (" + message + ")");
  }
  // A header cut before its frame marker can "succeed" with a 0 x 0 image.
  if (h.width < 1 || h.height < 1)
    fail(path, "corrupt or truncated JPEG header (no frame size before the data ends)");
  return h;
}

bool is_cmyk(int colorspace) { return colorspace == TJCS_CMYK || colorspace == TJCS_YCCK; }

// True when an APP14 "Adobe" marker precedes the scan. Photoshop writes CMYK JPEGs with this
// marker and with every CMYK sample inverted (255 = no ink); libjpeg does not undo that, so
// the convention of PIL, browsers and torchvision is: Adobe marker => inverted CMYK.
bool has_adobe_marker(const std::vector<uint8_t>& b) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= b.size()) {
    if (b[pos] != 0xFF) return false;  // lost sync: leave it to the decoder to complain
    const uint8_t marker = b[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return false;          // start of scan / end of image
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length field
      pos += 2;
      continue;
    }
    const size_t length = (size_t{b[pos + 2]} << 8) | b[pos + 3];
    if (marker == 0xEE && length >= 7 && pos + 4 + 5 <= b.size() &&
        std::memcmp(&b[pos + 4], "Adobe", 5) == 0)
      return true;
    pos += 2 + length;
  }
  return false;
}

// The scale in {1, 1/2, 1/4, 1/8} with the fewest output pixels that still covers the minimum
// size. Only these four: libjpeg-turbo's SIMD IDCTs are the 8x8, 4x4, 2x2 and 1x1 ones; the
// fractional factors (7/8, 3/4, 5/8, 3/8) run in plain C (and so does their chroma, scaled by
// IDCT to twice the luma's size to spare the upsampler). Measured on a 2-core CPU box, one
// thread, 600 scripts/make_image_folder.py files (320-640 px, quality 90), min 224 x 224: with
// the fractional factors allowed the set decoded at ~820 img/s, slower than full size (~940);
// with these four, ~1040. (Two thirds of those files have a side under 448 px: only full size
// covers 224 there.)
tjscalingfactor choose_scale(int width, int height, int64_t min_width, int64_t min_height) {
  tjscalingfactor best{1, 1};
  if (min_width <= 0 && min_height <= 0) return best;  // no minimum given: full size
  int64_t best_pixels = int64_t{width} * height;
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; factors != nullptr && i < count; ++i) {
    const tjscalingfactor f = factors[i];
    if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
    const int64_t w = TJSCALED(width, f), h = TJSCALED(height, f);
    if (w >= min_width && h >= min_height && w * h < best_pixels) {
      best = f;
      best_pixels = w * h;
    }
  }
  return best;
}

// TurboJPEG flags. Without a minimum size: libjpeg's defaults (accurate integer IDCT, "fancy"
// triangle-filter chroma upsampling), the decode PIL gives. With one, the image is about to be
// resized (the loader's path), so both speed-for-accuracy trades are taken:
// TJFLAG_FASTDCT (the SIMD "ifast" 8x8 IDCT; at 1/2 .. 1/8 it touches only the chroma, which
// libjpeg decodes with the 8x8 IDCT there) and TJFLAG_FASTUPSAMPLE (chroma replicated, not
// interpolated; a no-op at 1/2 .. 1/8 for 4:2:0, where chroma needs no upsampling). Same box and
// files: ~8 % more img/s, and against the accurate decode at the same scale a mean |diff| of
// 1.22 gray levels (max 77, at sharp color edges: the upsampling) at full size, 0.57 (max 4) at
// 1/2.
int decode_flags(int64_t min_width, int64_t min_height) {
  return min_width > 0 || min_height > 0 ? TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE : 0;
}

void check_decompress(int status, TjHandle& tj, const std::string& path) {
  if (status == 0) return;
  const bool warning = tjGetErrorCode(tj.get()) == TJERR_WARNING;
  const std::string message = tj.error_and_reset();
  if (is_harmless_warning(warning, message)) return;
  fail(path, "corrupt or truncated JPEG (" + message + ")");
}

// (C, H, W), or (H, W, C) when `interleaved` (as libjpeg writes it: no transposition), at
// `scale` with `flags`.
at::Tensor decode_jpeg_at(const std::vector<uint8_t>& bytes, const std::string& path,
                          const JpegHeader& header, int64_t channels, tjscalingfactor scale,
                          int flags, bool interleaved) {
  const int width = TJSCALED(header.width, scale), height = TJSCALED(header.height, scale);
  detail::check_pixel_count(height, width, path);
  TjHandle& tj = decompressor();
  const auto size = static_cast<unsigned long>(bytes.size());

  if (is_cmyk(header.colorspace)) {
    std::vector<uint8_t> cmyk(static_cast<size_t>(width) * height * 4);
    check_decompress(tjDecompress2(tj.get(), bytes.data(), size, cmyk.data(), width, 0, height,
                                   TJPF_CMYK, flags),
                     tj, path);
    const bool inverted = has_adobe_marker(bytes);
    std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
    for (size_t i = 0, n = static_cast<size_t>(width) * height; i < n; ++i) {
      const uint32_t k = inverted ? cmyk[4 * i + 3] : 255u - cmyk[4 * i + 3];
      for (int c = 0; c < 3; ++c) {
        const uint32_t v = inverted ? cmyk[4 * i + c] : 255u - cmyk[4 * i + c];
        rgb[3 * i + c] = static_cast<uint8_t>((v * k + 127u) / 255u);  // (255-C)(255-K)/255
      }
    }
    at::Tensor planar = detail::interleaved_to_planar(rgb.data(), height, width, 3, channels);
    return interleaved ? planar.permute({1, 2, 0}).contiguous() : planar;
  }

  // Gray JPEGs decode to TJPF_RGB by replication, color ones to TJPF_GRAY as their Y plane
  // (BT.601 luma, computed by the encoder), both inside libjpeg.
  at::Tensor hwc = at::empty({height, width, channels}, at::kByte);
  check_decompress(tjDecompress2(tj.get(), bytes.data(), size, hwc.data_ptr<uint8_t>(), width, 0,
                                 height, channels == 1 ? TJPF_GRAY : TJPF_RGB, flags),
                   tj, path);
  if (interleaved) return hwc;
  if (channels == 1) return hwc.view({1, height, width});
  return hwc.permute({2, 0, 1}).contiguous();
}

at::Tensor decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                       int64_t min_height, int64_t min_width, bool interleaved) {
  const JpegHeader header = read_jpeg_header(bytes, path);
  return decode_jpeg_at(bytes, path, header, channels,
                        choose_scale(header.width, header.height, min_width, min_height),
                        decode_flags(min_width, min_height), interleaved);
}

TjHandle& transformer() {
  thread_local TjHandle handle(TjHandle::Kind::kTransform);
  return handle;
}

// The largest 1 / denom (denom 8, 4, 2) at which `box` keeps min_height x min_width pixels;
// 1 when none does (or no minimum is given).
int box_scale_denom(const PixelBox& box, int64_t min_height, int64_t min_width) {
  if (min_height <= 0 && min_width <= 0) return 1;
  for (int denom : {8, 4, 2})
    if (box.height >= min_height * denom && box.width >= min_width * denom) return denom;
  return 1;
}

// TurboJPEG's way to a region: the JPEG cut losslessly to the blocks from (x0, y0) on, cut_w x
// cut_h full-resolution pixels (the transform entropy-decodes the whole file and re-encodes the
// cut), then the cut decoded at `scale`; the whole image needs no cut.
at::Tensor decode_jpeg_cut(const std::vector<uint8_t>& bytes, const std::string& path,
                           const JpegHeader& header, int64_t channels, tjscalingfactor scale,
                           int flags, int x0, int y0, int cut_w, int cut_h) {
  if (x0 == 0 && y0 == 0 && cut_w == header.width && cut_h == header.height)
    return decode_jpeg_at(bytes, path, header, channels, scale, flags, true);
  tjtransform cut{};
  cut.r = tjregion{x0, y0, cut_w, cut_h};
  cut.op = TJXOP_NONE;
  cut.options = TJXOPT_CROP;
  TjHandle& tj = transformer();
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  const int status = tjTransform(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()),
                                 1, &out, &out_size, &cut, 0);
  std::vector<uint8_t> cropped;
  if (out != nullptr) {
    cropped.assign(out, out + out_size);
    tjFree(out);
  }
  if (status != 0) {
    const bool warning = tjGetErrorCode(tj.get()) == TJERR_WARNING;
    const std::string message = tj.error_and_reset();
    if (!is_harmless_warning(warning, message) || cropped.empty())
      fail(path, "corrupt or truncated JPEG (" + message + ")");
  }
  JpegHeader cut_header = header;
  cut_header.width = cut_w;
  cut_header.height = cut_h;
  return decode_jpeg_at(cropped, path, cut_header, channels, scale, flags, true);
}

DecodedRegion decode_jpeg_region(const std::vector<uint8_t>& bytes, const std::string& path,
                                 int64_t channels, const PixelBox& box, int64_t min_height,
                                 int64_t min_width) {
  const JpegHeader header = read_jpeg_header(bytes, path);
  check_box_inside(box, header.height, header.width, path);
  DecodedRegion r;
  r.scale_denom = box_scale_denom(box, min_height, min_width);
  const int64_t d = r.scale_denom;
  const int flags = decode_flags(min_width, min_height);
  double origin_top = 0, origin_left = 0;  // the region's first pixel in the image at 1 / d
  if (detail::jpeg_window_available() && !is_cmyk(header.colorspace)) {
    // libjpeg's own API: the rows above the box skipped, the columns beside it cropped, the
    // rows below never read; no transform.
    const int64_t y0 = box.top / d, y1 = (box.top + box.height + d - 1) / d;
    const int64_t x0 = box.left / d, x1 = (box.left + box.width + d - 1) / d;
    detail::check_pixel_count(y1 - y0, x1 - x0, path);
    detail::JpegWindow w = detail::decode_jpeg_window(bytes, static_cast<int>(channels),
                                                      r.scale_denom, flags != 0, y0, y1, x0, x1);
    if (!w.error.empty()) fail(path, "corrupt or truncated JPEG (" + w.error + ")");
    if (!w.warning.empty() && !is_harmless_warning(true, w.warning))
      fail(path, "corrupt or truncated JPEG (" + w.warning + ")");
    r.image = std::move(w.image);
    origin_top = static_cast<double>(w.top);
    origin_left = static_cast<double>(w.left);
  } else {
    // The cut starts on the block grid (TurboJPEG's lossless crop needs that) and ends with
    // the box.
    const int mcu_w = tjMCUWidth[header.subsampling], mcu_h = tjMCUHeight[header.subsampling];
    const int x0 = static_cast<int>(box.left) / mcu_w * mcu_w;
    const int y0 = static_cast<int>(box.top) / mcu_h * mcu_h;
    r.image = decode_jpeg_cut(bytes, path, header, channels, tjscalingfactor{1, r.scale_denom},
                              flags, x0, y0, static_cast<int>(box.left + box.width) - x0,
                              static_cast<int>(box.top + box.height) - y0);
    origin_top = static_cast<double>(y0) / static_cast<double>(d);  // exact: y0 is on the grid
    origin_left = static_cast<double>(x0) / static_cast<double>(d);
  }
  r.top = static_cast<double>(box.top) / static_cast<double>(d) - origin_top;
  r.left = static_cast<double>(box.left) / static_cast<double>(d) - origin_left;
  r.height = static_cast<double>(box.height) / static_cast<double>(d);
  r.width = static_cast<double>(box.width) / static_cast<double>(d);
  return r;
}
#else   // built without TurboJPEG (data/CMakeLists.txt): IDX and PNG only
struct JpegHeader {
  int width = 0, height = 0, colorspace = 0;
};
[[noreturn]] void no_jpeg(const std::string& path) {
  fail(path,
       "a JPEG file, but this tandem was built without TurboJPEG: install libturbojpeg0-dev "
       "(turbojpeg.h) and rebuild to read JPEGs");
}
JpegHeader read_jpeg_header(const std::vector<uint8_t>&, const std::string& path) { no_jpeg(path); }
at::Tensor decode_jpeg(const std::vector<uint8_t>&, const std::string& path, int64_t, int64_t,
                       int64_t, bool) {
  no_jpeg(path);
}
DecodedRegion decode_jpeg_region(const std::vector<uint8_t>&, const std::string& path, int64_t,
                                 const PixelBox&, int64_t, int64_t) {
  no_jpeg(path);
}
#endif  // TANDEM_DATA_NO_TURBOJPEG

ImageFormat sniff_or_fail(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (bytes.empty()) fail(path, "empty file (0 bytes), not an image");
  const ImageFormat format = sniff_format(bytes);
  if (format == ImageFormat::kUnknown) {
    static const char* kHex = "0123456789abcdef";
    std::string head;
    for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
      if (i > 0) head += ' ';
      head += kHex[bytes[i] >> 4];
      head += kHex[bytes[i] & 15];
    }
    fail(path, "not a JPEG or PNG file (it starts with bytes " + head + ")");
  }
  return format;
}

#ifndef TANDEM_DATA_NO_TURBOJPEG  // encode_jpeg's check: without TurboJPEG there is none
void check_encodable(const at::Tensor& t, const char* what) {
  TANDEM_CHECK_ARG(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kByte &&
                       t.dim() == 3 && (t.size(0) == 1 || t.size(0) == 3) && t.size(1) >= 1 &&
                       t.size(2) >= 1 && t.size(1) <= 65535 && t.size(2) <= 65535,
                   what, ": expected a (C, H, W) uint8 CPU tensor with C = 1 or 3 and H, W in ",
                   "[1, 65535], got ",
                   t.defined() ? t.toString() + " of shape " + c10::str(t.sizes()) : "undefined");
}
#endif  // TANDEM_DATA_NO_TURBOJPEG

}  // namespace

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    default:
      return "unknown";
  }
}

ImageFormat sniff_format(const uint8_t* bytes, size_t size) {
  if (size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(bytes, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageInfo read_image_info(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (sniff_or_fail(bytes, path) == ImageFormat::kPng) return detail::read_png_info(bytes, path);
  const JpegHeader header = read_jpeg_header(bytes, path);
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  info.height = header.height;
  info.width = header.width;
#ifndef TANDEM_DATA_NO_TURBOJPEG
  info.channels = header.colorspace == TJCS_GRAY ? 1 : is_cmyk(header.colorspace) ? 4 : 3;
#endif
  info.bit_depth = 8;
  info.progressive =
      detail::is_progressive_frame(detail::walk_markers(bytes.data(), bytes.size()).frame);
  return info;
}

namespace {
at::Tensor decode_any(const std::vector<uint8_t>& bytes, const std::string& path, int64_t channels,
                      int64_t min_height, int64_t min_width, bool interleaved) {
  check_decode_args(channels, min_height, min_width, path, "decode_image");
  if (sniff_or_fail(bytes, path) == ImageFormat::kPng) {
    at::Tensor chw = detail::decode_png(bytes, path, channels);
    return interleaved ? chw.permute({1, 2, 0}).contiguous() : chw;
  }
  return decode_jpeg(bytes, path, channels, min_height, min_width, interleaved);
}
}  // namespace

at::Tensor decode_image(const std::vector<uint8_t>& bytes, const std::string& path,
                        int64_t channels, int64_t min_height, int64_t min_width) {
  return decode_any(bytes, path, channels, min_height, min_width, false);
}

at::Tensor decode_image_interleaved(const std::vector<uint8_t>& bytes, const std::string& path,
                                    int64_t channels, int64_t min_height, int64_t min_width) {
  return decode_any(bytes, path, channels, min_height, min_width, true);
}

DecodedRegion decode_image_region(const std::vector<uint8_t>& bytes, const std::string& path,
                                  int64_t channels, const PixelBox& box, int64_t min_height,
                                  int64_t min_width) {
  check_decode_args(channels, min_height, min_width, path, "decode_image_region");
  if (sniff_or_fail(bytes, path) == ImageFormat::kJpeg)
    return decode_jpeg_region(bytes, path, channels, box, min_height, min_width);
  const at::Tensor hwc = detail::decode_png(bytes, path, channels).permute({1, 2, 0});
  check_box_inside(box, hwc.size(0), hwc.size(1), path);
  DecodedRegion r;
  r.image = hwc.slice(0, box.top, box.top + box.height)
                .slice(1, box.left, box.left + box.width)
                .contiguous();
  r.height = static_cast<double>(box.height);
  r.width = static_cast<double>(box.width);
  return r;
}

at::Tensor decode_mask(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (sniff_or_fail(bytes, path) == ImageFormat::kJpeg)
    fail(path, "a mask must be a PNG of class ids, not a JPEG (lossy compression alters ids)");
  return detail::decode_png_mask(bytes, path);
}

std::vector<uint8_t> encode_jpeg(const at::Tensor& chw_u8, int quality,
                                 ChromaSubsampling subsampling) {
#ifdef TANDEM_DATA_NO_TURBOJPEG
  throw Error(
      "encode_jpeg: this tandem was built without TurboJPEG: install libturbojpeg0-dev "
      "(turbojpeg.h) and rebuild to write JPEGs");
#else
  check_encodable(chw_u8, "encode_jpeg");
  TANDEM_CHECK_ARG(quality >= 1 && quality <= 100, "encode_jpeg: quality must be in [1, 100], got ",
                   quality);
  const bool gray = chw_u8.size(0) == 1;
  const at::Tensor hwc = chw_u8.permute({1, 2, 0}).contiguous();
  const int height = static_cast<int>(chw_u8.size(1)), width = static_cast<int>(chw_u8.size(2));
  const int samp = gray                                     ? TJSAMP_GRAY
                   : subsampling == ChromaSubsampling::k444 ? TJSAMP_444
                   : subsampling == ChromaSubsampling::k422 ? TJSAMP_422
                                                            : TJSAMP_420;
  TjHandle& tj = compressor();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(tj.get(), hwc.data_ptr<uint8_t>(), width, 0, height,
                                 gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &size, samp, quality, 0);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(jpeg, tjFree);
  if (status != 0) throw Error("encode_jpeg: " + tj.error_and_reset());
  return std::vector<uint8_t>(jpeg, jpeg + size);
#endif
}

std::vector<uint8_t> baseline_jpeg(const std::vector<uint8_t>& bytes, const std::string& path) {
#ifdef TANDEM_DATA_NO_TURBOJPEG
  no_jpeg(path);
#else
  if (sniff_or_fail(bytes, path) != ImageFormat::kJpeg) fail(path, "not a JPEG");
  read_jpeg_header(bytes, path);  // names a header cut short
  tjtransform same{};             // TJXOP_NONE, no progressive output: sequential scans
  TjHandle& tj = transformer();
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  const int status = tjTransform(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()),
                                 1, &out, &out_size, &same, 0);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(out, tjFree);
  if (status != 0) {
    const bool warning = tjGetErrorCode(tj.get()) == TJERR_WARNING;
    const std::string message = tj.error_and_reset();
    // A premature end is a warning to TurboJPEG: the missing blocks would be written flat.
    if (!is_harmless_warning(warning, message) || out == nullptr)
      fail(path, "corrupt or truncated JPEG (" + message + ")");
  }
  return std::vector<uint8_t>(out, out + out_size);
#endif
}

std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes) {
  // Regular files only, and nothing here may block: stat() first, so a FIFO or a device is
  // never opened (open() of a FIFO waits for a writer, forever); O_NONBLOCK and fstat() after
  // open() cover a file swapped for one in between. O_NONBLOCK does not change a regular file's
  // reads.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot open: " + errno_message(errno));
  auto check_kind = [&] {
    if (S_ISDIR(st.st_mode)) fail(path, "cannot read: " + errno_message(EISDIR));
    if (const char* kind = fs::special_file_kind(st.st_mode))
      fail(path, std::string("not a regular file: ") + kind);
  };
  check_kind();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail(path, "cannot open: " + errno_message(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_message(errno));
  check_kind();
  std::vector<uint8_t> bytes;
  const size_t size = st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0;
  bytes.reserve(std::min(size, max_bytes));
  uint8_t chunk[1 << 16];
  while (bytes.size() < max_bytes) {
    const ssize_t n = ::read(fd, chunk, std::min(sizeof chunk, max_bytes - bytes.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read: " + errno_message(errno));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create: " + errno_message(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int code = errno;
      ::close(fd);
      fail(path, "cannot write: " + errno_message(code));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail(path, "cannot write: " + errno_message(errno));
}

namespace detail {

void check_pixel_count(int64_t height, int64_t width, const std::string& path) {
  if (height < 1 || width < 1 || height * width > kMaxImagePixels)
    fail(path, "image of " + std::to_string(width) + " x " + std::to_string(height) +
                   " pixels refused (the limit is " + std::to_string(kMaxImagePixels) + " pixels)");
}

at::Tensor interleaved_to_planar(const uint8_t* hwc, int64_t height, int64_t width, int stored,
                                 int64_t channels) {
  at::Tensor out = at::empty({channels, height, width}, at::kByte);
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t n = height * width;
  const bool color = stored >= 3;
  if (channels == 1) {
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = hwc + i * stored;
      dst[i] = color ? luma601(p[0], p[1], p[2]) : p[0];
    }
    return out;
  }
  uint8_t* r = dst;
  uint8_t* g = dst + n;
  uint8_t* b = dst + 2 * n;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = hwc + i * stored;
    r[i] = p[0];
    g[i] = color ? p[1] : p[0];
    b[i] = color ? p[2] : p[0];
  }
  return out;
}

}  // namespace detail
}  // namespace tandem::data
