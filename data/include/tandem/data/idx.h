// IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed: an images file
// (magic 0x00000803: count, rows, cols, then uint8 pixels) and a labels file (magic 0x00000801:
// count, then uint8 labels), held in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/loader.h"

namespace tandem::data {

/// The decompressed content of a file: gzip is detected by its magic bytes and inflated
/// (zlib), anything else is returned as is. Throws tandem::Error naming the path and the cause
/// when the file cannot be read or the gzip stream is corrupt or truncated.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

/// Fields: {"image", {1, rows, cols}, kByte}, {"label", {}, kLong}.
class IdxDataset : public Dataset {
 public:
  /// Reads both files whole. Throws InvalidArgument naming the file for a wrong magic number
  /// (expected 0x00000803 for images, 0x00000801 for labels; other element types unsupported),
  /// zero rows or columns, or counts that differ between the two files; tandem::Error naming
  /// the file when it is unreadable, truncated (fewer bytes than its header announces) or
  /// carries bytes past them.
  IdxDataset(std::string images_path, std::string labels_path);

  int64_t size() const override { return count_; }
  std::vector<FieldSpec> fields() const override;
  /// Copies sample `index` (thread-safe: reads only). InvalidArgument for an index out of range.
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  /// The label of sample `index` (0 .. 255).
  int64_t label(int64_t index) const { return labels_.at(static_cast<size_t>(index)); }

 private:
  std::string images_path_, labels_path_;
  int64_t count_ = 0, rows_ = 0, cols_ = 0;
  std::vector<uint8_t> pixels_;  // (count, rows, cols)
  std::vector<uint8_t> labels_;  // (count)
};

}  // namespace tandem::data
