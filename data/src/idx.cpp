// IdxDataset and the gzip-or-raw file reader it uses (see idx.h).
#include "tandem/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "tandem/data/decode.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dim

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// Checks the magic and that the file holds exactly the header plus `payload` bytes.
void check_layout(const std::vector<uint8_t>& bytes, const std::string& path, uint32_t magic,
                  size_t header, const char* what) {
  if (bytes.size() < 4)
    throw Error(path + ": truncated IDX " + what + " file (" + std::to_string(bytes.size()) +
                " bytes, no header)");
  const uint32_t found = be32(bytes.data());
  TANDEM_CHECK_ARG(found == magic, path, ": not an IDX ", what, " file (magic ", hex32(found),
                   ", expected ", hex32(magic), ")");
  if (bytes.size() < header)
    throw Error(path + ": truncated IDX " + what + " file (" + std::to_string(bytes.size()) +
                " bytes, header needs " + std::to_string(header) + ")");
}

void check_payload(const std::vector<uint8_t>& bytes, const std::string& path, size_t header,
                   uint64_t payload, const char* what) {
  const uint64_t have = bytes.size() - header;
  if (have < payload)
    throw Error(path + ": truncated IDX " + what + " file (header announces " +
                std::to_string(payload) + " bytes of data, found " + std::to_string(have) + ")");
  if (have > payload)
    throw Error(path + ": IDX " + what + " file has " + std::to_string(have - payload) +
                " bytes past the " + std::to_string(payload) + " its header announces");
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  std::vector<uint8_t> raw = read_file(path);
  if (raw.size() < 2 || raw[0] != 0x1F || raw[1] != 0x8B) return raw;
  // Inflate with zlib's stream API (gzip wrapper: windowBits 15 + 16), concatenated members
  // included, so a truncated or corrupt stream is an error rather than a short read.
  z_stream stream;
  std::memset(&stream, 0, sizeof stream);
  if (inflateInit2(&stream, 15 + 16) != Z_OK) throw Error(path + ": zlib: cannot start inflate");
  std::vector<uint8_t> out;
  out.reserve(raw.size() * 4);
  uint8_t chunk[1 << 16];
  size_t consumed = 0;
  int status = Z_OK;
  while (consumed < raw.size()) {
    const size_t take = std::min<size_t>(raw.size() - consumed, 1u << 30);
    stream.next_in = raw.data() + consumed;
    stream.avail_in = static_cast<uInt>(take);
    do {
      stream.next_out = chunk;
      stream.avail_out = sizeof chunk;
      status = inflate(&stream, Z_NO_FLUSH);
      if (status == Z_BUF_ERROR) {  // no progress possible: all input used, no output pending
        status = Z_OK;
        break;
      }
      if (status != Z_OK && status != Z_STREAM_END) {
        const std::string message = stream.msg != nullptr ? stream.msg : "corrupt data";
        inflateEnd(&stream);
        throw Error(path + ": corrupt gzip data (" + message + ")");
      }
      out.insert(out.end(), chunk, chunk + (sizeof chunk - stream.avail_out));
      // A full output chunk may leave output pending inside zlib even with no input left.
    } while ((stream.avail_in > 0 || stream.avail_out == 0) && status != Z_STREAM_END);
    consumed += take - stream.avail_in;
    if (status == Z_STREAM_END) {
      // Another gzip member may follow (as `cat a.gz b.gz` makes); trailing zeros are padding.
      while (consumed < raw.size() && raw[consumed] == 0) ++consumed;
      if (consumed < raw.size()) inflateReset(&stream);
    } else if (take - stream.avail_in == 0) {
      break;  // no progress: cannot happen with input left, but never spin
    }
  }
  inflateEnd(&stream);
  if (status != Z_STREAM_END)
    throw Error(path + ": truncated gzip file (the compressed stream ends early)");
  return out;
}

IdxDataset::IdxDataset(std::string images_path, std::string labels_path)
    : images_path_(std::move(images_path)), labels_path_(std::move(labels_path)) {
  std::vector<uint8_t> images = read_maybe_gzip(images_path_);
  check_layout(images, images_path_, kImagesMagic, 16, "images");
  count_ = be32(&images[4]);
  rows_ = be32(&images[8]);
  cols_ = be32(&images[12]);
  TANDEM_CHECK_ARG(rows_ >= 1 && cols_ >= 1, images_path_, ": IDX images of ", rows_, " x ", cols_,
                   " pixels (expected at least 1 x 1)");
  check_payload(images, images_path_, 16, uint64_t(count_) * rows_ * cols_, "images");

  std::vector<uint8_t> labels = read_maybe_gzip(labels_path_);
  check_layout(labels, labels_path_, kLabelsMagic, 8, "labels");
  const int64_t label_count = be32(&labels[4]);
  check_payload(labels, labels_path_, 8, uint64_t(label_count), "labels");
  TANDEM_CHECK_ARG(label_count == count_, "IDX: ", images_path_, " holds ", count_, " images but ",
                   labels_path_, " holds ", label_count, " labels");

  pixels_.assign(images.begin() + 16, images.end());
  labels_.assign(labels.begin() + 8, labels.end());
}

std::vector<FieldSpec> IdxDataset::fields() const {
  return {{"image", {1, rows_, cols_}, at::kByte}, {"label", {}, at::kLong}};
}

void IdxDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(index >= 0 && index < count_, "IdxDataset: sample index ", index,
                   " out of range [0, ", count_, ")");
  TANDEM_CHECK_ARG(out.size() == 2, "IdxDataset: get() needs 2 output tensors (image, label), ",
                   "got ", out.size());
  TANDEM_CHECK_ARG(out[0].is_contiguous() && out[0].numel() == rows_ * cols_ &&
                       out[0].scalar_type() == at::kByte,
                   "IdxDataset: the image output must be a contiguous uint8 tensor of ",
                   rows_ * cols_, " elements");
  const size_t pixels = static_cast<size_t>(rows_ * cols_);
  std::memcpy(out[0].data_ptr<uint8_t>(), pixels_.data() + static_cast<size_t>(index) * pixels,
              pixels);
  out[1].fill_(static_cast<int64_t>(labels_[static_cast<size_t>(index)]));
}

}  // namespace tandem::data
