// The PNG half of decode.h through libpng: images (palette, 1-16 bit, gray, gray + alpha, RGB,
// RGBA -> 1 or 3 channels of 8 bits) and masks of class ids (raw palette indices or gray values).
//
// libpng reports errors by longjmp. A longjmp must not cross a frame with live C++ objects, so
// each libpng phase runs in a function whose frame holds only trivial locals, returns false on
// error, and the C++ caller owns every allocation and throws.
#include <ATen/ops/empty.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "codec_util.h"
#include "tandem/data/decode.h"
#include "tandem/error.h"

namespace tandem::data {
namespace detail {
namespace {

// One decode: the libpng structs, the input cursor, and the message of the error that ended it.
struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[256] = {0};

  PngReader(const std::vector<uint8_t>& bytes, const std::string& path);
  ~PngReader() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
};

void on_error(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof reader->message, "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // e.g. an iCCP profile libpng dislikes

void on_read(png_structp png, png_bytep out, size_t n) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->size - reader->pos < n) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, reader->data + reader->pos, n);
  reader->pos += n;
}

PngReader::PngReader(const std::vector<uint8_t>& bytes, const std::string& path)
    : data(bytes.data()), size(bytes.size()) {
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, this, on_error, on_warning);
  if (png == nullptr) fail(path, "libpng: cannot create a read struct");
  info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);  // no destructor for a half-built reader
    fail(path, "libpng: cannot create an info struct");
  }
}

enum class PngMode { kImage, kMask };

// The layout of the rows png_read_image will produce, after the transforms.
struct PngLayout {
  png_uint_32 width = 0, height = 0;
  int color_type = 0;  // as stored
  int bit_depth = 0;   // of the produced rows
  int channels = 0;    // of the produced rows
  size_t row_bytes = 0;
};

// Phase 1: header, transforms, layout. Trivial locals only (see the file comment).
bool read_header(PngReader& r, PngMode mode, PngLayout* layout) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_set_read_fn(r.png, &r, on_read);
  png_read_info(r.png, r.info);
  int bit_depth = 0, color_type = 0;
  png_get_IHDR(r.png, r.info, &layout->width, &layout->height, &bit_depth, &color_type, nullptr,
               nullptr, nullptr);
  layout->color_type = color_type;
  if (mode == PngMode::kImage) {
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);  // RGB(A)
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(r.png);
    if (bit_depth == 16) png_set_strip_16(r.png);
  } else {
    if (bit_depth < 8) png_set_packing(r.png);  // one byte per id, values unscaled
    if (bit_depth == 16) png_set_swap(r.png);   // little-endian 16-bit ids
  }
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  layout->bit_depth = png_get_bit_depth(r.png, r.info);
  layout->channels = png_get_channels(r.png, r.info);
  layout->row_bytes = png_get_rowbytes(r.png, r.info);
  return true;
}

// Phase 2: every row (all passes of an interlaced image). IEND and chunks after the image data
// are not read: a file cut right after its last IDAT still holds the whole image.
bool read_rows(PngReader& r, png_bytepp rows) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_read_image(r.png, rows);
  return true;
}

const char* color_type_name(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return "gray";
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return "gray + alpha";
    case PNG_COLOR_TYPE_PALETTE:
      return "palette";
    case PNG_COLOR_TYPE_RGB:
      return "RGB";
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return "RGBA";
    default:
      return "unknown";
  }
}

[[noreturn]] void fail_png(const PngReader& r, const std::string& path) {
  fail(path, std::string("corrupt or truncated PNG (") + r.message + ")");
}

// Decodes all rows into one buffer of layout.row_bytes x height.
std::vector<uint8_t> read_pixels(PngReader& r, const PngLayout& layout, const std::string& path) {
  std::vector<uint8_t> pixels(layout.row_bytes * layout.height);
  std::vector<png_bytep> rows(layout.height);
  for (png_uint_32 y = 0; y < layout.height; ++y) rows[y] = pixels.data() + y * layout.row_bytes;
  if (!read_rows(r, rows.data())) fail_png(r, path);
  return pixels;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

ImageInfo read_png_info(const std::vector<uint8_t>& bytes, const std::string& path) {
  // Signature (8), then IHDR: length (4) = 13, "IHDR", width, height, depth, color type, ...
  if (bytes.size() < 8 + 8 + 13 || be32(&bytes[8]) != 13 || std::memcmp(&bytes[12], "IHDR", 4) != 0)
    fail(path, "corrupt or truncated PNG (no complete IHDR header)");
  const uint8_t* ihdr = &bytes[16];
  ImageInfo info;
  info.format = ImageFormat::kPng;
  info.width = be32(ihdr);
  info.height = be32(ihdr + 4);
  info.bit_depth = ihdr[8];
  const int color_type = ihdr[9];
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      info.channels = 1;
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      info.channels = 2;
      break;
    case PNG_COLOR_TYPE_RGB:
      info.channels = 3;
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      info.channels = 4;
      break;
    case PNG_COLOR_TYPE_PALETTE: {
      // A palette with a tRNS chunk (before the image data) carries alpha.
      info.channels = 3;
      for (size_t pos = 8; pos + 8 <= bytes.size();) {
        const uint32_t length = be32(&bytes[pos]);
        if (std::memcmp(&bytes[pos + 4], "IDAT", 4) == 0) break;
        if (std::memcmp(&bytes[pos + 4], "tRNS", 4) == 0) info.channels = 4;
        pos += size_t{12} + length;
      }
      break;
    }
    default:
      fail(path, "corrupt PNG (color type " + std::to_string(color_type) + " in IHDR)");
  }
  if (info.width < 1 || info.height < 1)
    fail(path, "corrupt PNG (size " + std::to_string(info.width) + " x " +
                   std::to_string(info.height) + " in IHDR)");
  return info;
}

at::Tensor decode_png(const std::vector<uint8_t>& bytes, const std::string& path,
                      int64_t channels) {
  PngReader reader(bytes, path);
  PngLayout layout;
  if (!read_header(reader, PngMode::kImage, &layout)) fail_png(reader, path);
  check_pixel_count(layout.height, layout.width, path);
  if (layout.bit_depth != 8 || layout.channels < 1 || layout.channels > 4 ||
      layout.row_bytes != size_t{layout.width} * layout.channels)
    fail(path, std::string("unsupported PNG layout (") + color_type_name(layout.color_type) + ", " +
                   std::to_string(layout.bit_depth) + "-bit after conversion)");
  const std::vector<uint8_t> pixels = read_pixels(reader, layout, path);
  return interleaved_to_planar(pixels.data(), layout.height, layout.width, layout.channels,
                               channels);
}

at::Tensor decode_png_mask(const std::vector<uint8_t>& bytes, const std::string& path) {
  PngReader reader(bytes, path);
  PngLayout layout;
  if (!read_header(reader, PngMode::kMask, &layout)) fail_png(reader, path);
  if (layout.color_type == PNG_COLOR_TYPE_RGB || layout.color_type == PNG_COLOR_TYPE_RGB_ALPHA)
    fail(path, std::string("a mask must be a gray or palette PNG of class ids, this one is ") +
                   color_type_name(layout.color_type));
  check_pixel_count(layout.height, layout.width, path);
  const std::vector<uint8_t> pixels = read_pixels(reader, layout, path);
  at::Tensor mask = at::empty({int64_t{layout.height}, int64_t{layout.width}}, at::kLong);
  int64_t* out = mask.data_ptr<int64_t>();
  const int stride = layout.channels;  // gray + alpha: the id is the first sample
  for (png_uint_32 y = 0; y < layout.height; ++y) {
    const uint8_t* row = pixels.data() + y * layout.row_bytes;
    int64_t* dst = out + int64_t{y} * layout.width;
    if (layout.bit_depth == 16) {
      for (png_uint_32 x = 0; x < layout.width; ++x) {
        const uint8_t* p = row + 2 * size_t{x} * stride;
        dst[x] = p[0] | (int64_t{p[1]} << 8);
      }
    } else {
      for (png_uint_32 x = 0; x < layout.width; ++x) dst[x] = row[size_t{x} * stride];
    }
  }
  return mask;
}

}  // namespace detail

std::vector<uint8_t> encode_png(const at::Tensor& chw_u8) {
  TANDEM_CHECK_ARG(chw_u8.defined() && chw_u8.device().is_cpu() &&
                       chw_u8.scalar_type() == at::kByte && chw_u8.dim() == 3 &&
                       (chw_u8.size(0) == 1 || chw_u8.size(0) == 3) && chw_u8.size(1) >= 1 &&
                       chw_u8.size(2) >= 1 && chw_u8.size(1) <= (int64_t{1} << 24) &&
                       chw_u8.size(2) <= (int64_t{1} << 24),
                   "encode_png: expected a (C, H, W) uint8 CPU tensor with C = 1 or 3, got ",
                   chw_u8.defined() ? c10::str(chw_u8.scalar_type(), " of shape ", chw_u8.sizes())
                                    : std::string("undefined"));
  const at::Tensor hwc = chw_u8.permute({1, 2, 0}).contiguous();
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(chw_u8.size(2));
  image.height = static_cast<png_uint_32>(chw_u8.size(1));
  image.format = chw_u8.size(0) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  // One compression into a buffer of libpng's bound (asking for the size first compresses the
  // whole image twice).
  png_alloc_size_t size = PNG_IMAGE_PNG_SIZE_MAX(image);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, hwc.data_ptr<uint8_t>(), 0, nullptr))
    throw Error(std::string("encode_png: ") + image.message);
  out.resize(size);
  return out;
}

}  // namespace tandem::data
