// Image files to tensors on the CPU: JPEG through TurboJPEG (with DCT-domain scaled decode, so a
// large photo needed at 224 px is decoded at 1/2, 1/4 or 1/8 of its size for a fraction of the
// cost), PNG through libpng; and the encoders the tests use to write their fixtures.
// Everything here is thread-safe: the loader's workers call it concurrently.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tandem::data {

enum class ImageFormat { kUnknown, kJpeg, kPng };

/// "jpeg", "png" or "unknown".
const char* format_name(ImageFormat format);

/// The format by its magic bytes (JPEG: FF D8 FF; PNG: the 8-byte signature), never by the
/// file's extension: a PNG named .jpg is a PNG.
ImageFormat sniff_format(const uint8_t* bytes, size_t size);
inline ImageFormat sniff_format(const std::vector<uint8_t>& bytes) {
  return sniff_format(bytes.data(), bytes.size());
}

/// What an image file's header says, without decoding its pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t height = 0;
  int64_t width = 0;
  /// Channels as stored: JPEG 1 (gray), 3 (YCbCr / RGB) or 4 (CMYK / YCCK); PNG 1 (gray),
  /// 2 (gray + alpha), 3 (RGB, or a palette), 4 (RGBA, or a palette with transparency).
  int64_t channels = 0;
  int64_t bit_depth = 8;  ///< bits per stored sample (PNG 1, 2, 4, 8 or 16; JPEG 8)
  /// A progressive JPEG (its frame one of SOF2, 6, 10, 14): every scan is read before the first
  /// row comes out, so a crop costs the CPU the whole file (~4x a baseline crop), and the JPEG
  /// engines do not read it. baseline_jpeg rewrites it without a loss.
  bool progressive = false;
};

/// Reads the header of a JPEG or PNG held in `bytes`. Throws tandem::Error naming `path` (used
/// only for the message) and the cause when the bytes are empty, not a JPEG or PNG, or the
/// header is truncated or corrupt.
ImageInfo read_image_info(const std::vector<uint8_t>& bytes, const std::string& path);

/// Decodes a JPEG or PNG into a (channels, H, W) uint8 contiguous CPU tensor.
///
/// `channels` is 1 (gray) or 3 (RGB); whatever the file stores is converted: gray is replicated
/// to RGB, RGB becomes luma with the ITU-R BT.601 weights libjpeg uses
/// ((19595 R + 38470 G + 7471 B + 32768) >> 16), alpha is dropped (not composited), a palette is
/// expanded, 16-bit samples keep their high byte, CMYK / YCCK JPEGs become RGB as
/// R = (255 - C)(255 - K) / 255 (rounded), with Adobe (Photoshop) JPEGs' inverted CMYK — those
/// with an APP14 "Adobe" marker — read as inverted.
///
/// JPEG only: when min_height / min_width are given, the JPEG is decoded at the smallest of the
/// scales 1/8, 1/4, 1/2 (DCT-domain scaling, SIMD in libjpeg-turbo) whose output still has
/// H >= min_height and W >= min_width, else at full size; so (640 x 480, min 224 x 224) decodes
/// to 320 x 240, and (400 x 300, min 224 x 224) at full size (libjpeg-turbo's 3/4 would cover
/// it, but its plain-C IDCT decodes slower than full size). Such a decode is meant to be
/// resized, so it also uses the fast IDCT and chroma upsampling: about 1 gray level of mean
/// difference from the accurate decode. Without a minimum the decode is libjpeg's accurate one
/// (PIL's). PNGs are always decoded at full size and exactly.
///
/// Throws tandem::InvalidArgument for channels not 1 or 3 or negative minimums, and
/// tandem::Error naming `path` and the cause, in one line, for an empty, truncated, corrupt,
/// unsupported or non-image input, or one of more than kMaxImagePixels pixels.
at::Tensor decode_image(const std::vector<uint8_t>& bytes, const std::string& path,
                        int64_t channels, int64_t min_height = 0, int64_t min_width = 0);

/// decode_image's pixels as (H, W, channels), interleaved as the decoders write them: a JPEG
/// needs no transposition (the loader's workers use this; resized_crop reads this layout).
at::Tensor decode_image_interleaved(const std::vector<uint8_t>& bytes, const std::string& path,
                                    int64_t channels, int64_t min_height = 0,
                                    int64_t min_width = 0);

/// A rectangle of an image, in the pixels of its full-resolution decode.
struct PixelBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

/// What decode_image_region returns: the region's pixels and where the box lies in them.
struct DecodedRegion {
  /// (h, w, channels) uint8, interleaved: the box's rows and columns at 1 / scale_denom — with
  /// the few rows and columns above and left of it that the JPEG's block grid brings along.
  at::Tensor image;
  /// The box within `image`, in its pixels: the full-resolution box over scale_denom, shifted
  /// by what was cut off (fractional where the box's edges fall inside a decoded pixel).
  double top = 0, left = 0, height = 0, width = 0;
  int scale_denom = 1;  ///< 1, 2, 4 or 8
};

/// Decodes only `box` of a JPEG or PNG, at the smallest of the DCT scales 1/8, 1/4, 1/2 (else
/// full size) at which the *box* still has at least min_height x min_width pixels: a crop that
/// torchvision would cut from the full-resolution image and shrink is shrunk here too, never
/// upsampled from a smaller decode (a whole-image scaled decode picks its scale for the whole
/// image, so a small box of a large photo came out a few dozen pixels wide and was enlarged).
/// A JPEG is decoded through libjpeg's API at that scale with decode_image's min-size flags
/// (fast IDCT and upsampling): the rows above the box skipped (entropy-decoded, nothing more),
/// the columns beside it cropped to the block grid, the rows below never read. (A build without
/// libjpeg's header, and CMYK files, cut the box's blocks out losslessly first — TurboJPEG's
/// transform, which entropy-decodes the whole file and re-encodes the cut — then decode that.)
/// PNGs decode whole and are cut. Throws
/// InvalidArgument for a box that is empty or outside the image, and what decode_image throws.
DecodedRegion decode_image_region(const std::vector<uint8_t>& bytes, const std::string& path,
                                  int64_t channels, const PixelBox& box, int64_t min_height,
                                  int64_t min_width);

/// Decodes a PNG of class ids (a segmentation mask) into an (H, W) int64 CPU tensor of its raw
/// sample values: the palette index of a palette PNG (as PIL's mode "P" gives them), the value
/// of a gray PNG (8 or 16 bits; alpha of gray + alpha ignored). Throws tandem::Error naming
/// `path` for an RGB / RGBA PNG, a JPEG (lossy: ids would not survive) or undecodable bytes.
at::Tensor decode_mask(const std::vector<uint8_t>& bytes, const std::string& path);

/// Images larger than this (after any scaled decode) are refused rather than allocated: a
/// corrupt or hostile header can claim 65535 x 65535.
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

enum class ChromaSubsampling { k444, k422, k420 };

/// Encodes a (C, H, W) uint8 CPU tensor, C = 1 or 3, as a baseline JPEG of `quality` (1..100);
/// 4:2:0 chroma by default, as PIL and cjpeg write. Throws InvalidArgument for any other input.
std::vector<uint8_t> encode_jpeg(const at::Tensor& chw_u8, int quality,
                                 ChromaSubsampling subsampling = ChromaSubsampling::k420);

/// A progressive JPEG written again as a baseline one without decoding it: the same DCT
/// coefficients, so it decodes to the same pixels, in sequential scans with the standard Huffman
/// tables (TurboJPEG's lossless transform, as `jpegtran` does; every marker segment kept). Throws
/// tandem::Error naming `path` for a corrupt or truncated file.
std::vector<uint8_t> baseline_jpeg(const std::vector<uint8_t>& bytes, const std::string& path);

/// Encodes a (C, H, W) uint8 CPU tensor, C = 1 or 3, as an 8-bit gray or RGB PNG (lossless).
/// Throws InvalidArgument for any other input.
std::vector<uint8_t> encode_png(const at::Tensor& chw_u8);

/// The whole content of a regular file (symlinks followed). Throws tandem::Error naming `path`
/// and strerror(errno) when it cannot be opened or read (missing, a directory, no permission),
/// or naming its kind when it is not a regular file ("not a regular file: a named pipe"): such a
/// file is never opened, and the open cannot block. `max_bytes`: read no more than the file's
/// first so many bytes (a header).
std::vector<uint8_t> read_file(const std::string& path,
                               size_t max_bytes = std::numeric_limits<size_t>::max());

/// Writes `bytes` to `path` (created or truncated). Throws tandem::Error naming `path` and
/// strerror(errno) on failure.
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace tandem::data
