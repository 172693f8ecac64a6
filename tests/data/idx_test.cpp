// IdxDataset: MNIST-format files, raw and gzip, and their bad forms (wrong magic, counts that
// differ, truncation, trailing bytes, corrupt gzip).
#include "tandem/data/idx.h"

#include <ATen/ops/full.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "fixtures.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

using testing::put;
using testing::TempDir;

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> idx_images(uint32_t count, uint32_t rows, uint32_t cols,
                                uint32_t magic = 0x00000803) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, count);
  put_be32(out, rows);
  put_be32(out, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 3));
  return out;
}

std::vector<uint8_t> idx_labels(uint32_t count, uint32_t magic = 0x00000801) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, count);
  for (uint32_t i = 0; i < count; ++i) out.push_back(static_cast<uint8_t>((i * 3) % 10));
  return out;
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& raw) {
  uLongf size = compressBound(raw.size()) + 64;
  std::vector<uint8_t> out(size);
  z_stream s{};
  deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // gzip wrapper
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

template <typename E, typename F>
void expect_error(F&& f, const std::string& path, const std::string& cause) {
  try {
    f();
    ADD_FAILURE() << "no error for " << path;
  } catch (const E& e) {
    testing::expect_one_line_naming(e.what(), path, cause);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(IdxTest, ReadsRawAndGzipFilesAlike) {
  TempDir dir;
  const auto images = idx_images(5, 4, 3), labels = idx_labels(5);
  const std::string raw_i = put(dir, "images-idx3-ubyte", images);
  const std::string raw_l = put(dir, "labels-idx1-ubyte", labels);
  const std::string gz_i = put(dir, "images-idx3-ubyte.gz", gzip(images));
  const std::string gz_l = put(dir, "labels-idx1-ubyte.gz", gzip(labels));
  EXPECT_EQ(read_maybe_gzip(gz_i), images);
  EXPECT_EQ(read_maybe_gzip(raw_i), images);

  const IdxDataset raw(raw_i, raw_l), gz(gz_i, raw_l), both(gz_i, gz_l);
  EXPECT_EQ(raw.size(), 5);
  EXPECT_EQ(raw.rows(), 4);
  EXPECT_EQ(raw.cols(), 3);
  const auto fields = raw.fields();
  EXPECT_EQ(fields[0].shape, (std::vector<int64_t>{1, 4, 3}));
  EXPECT_EQ(fields[0].dtype, at::kByte);
  EXPECT_TRUE(fields[1].shape.empty());
  EXPECT_EQ(fields[1].dtype, at::kLong);
  std::vector<at::Tensor> a = {at::full({1, 4, 3}, 0, at::kByte), at::full({}, -1, at::kLong)};
  std::vector<at::Tensor> b = {at::full({1, 4, 3}, 0, at::kByte), at::full({}, -1, at::kLong)};
  for (int64_t i = 0; i < 5; ++i) {
    raw.get(i, a);
    both.get(i, b);
    EXPECT_TRUE(a[0].equal(b[0]));
    EXPECT_EQ(a[1].item<int64_t>(), (i * 3) % 10);
    EXPECT_EQ(b[1].item<int64_t>(), (i * 3) % 10);
    EXPECT_EQ(raw.label(i), (i * 3) % 10);
    const uint8_t* p = a[0].data_ptr<uint8_t>();
    for (int k = 0; k < 12; ++k) EXPECT_EQ(p[k], static_cast<uint8_t>((i * 12 + k) * 7 + 3));
  }
  EXPECT_THROW(raw.get(5, a), InvalidArgument);
}

TEST(IdxTest, BadFilesNameTheFileAndTheProblem) {
  TempDir dir;
  const std::string labels = put(dir, "labels", idx_labels(5));
  // Wrong magic: a labels file given as images, and a 16-bit element type.
  expect_error<InvalidArgument>([&] { IdxDataset ds(labels, labels); }, labels,
                                "magic 0x00000801, expected 0x00000803");
  const std::string shorts = put(dir, "shorts", idx_images(5, 2, 2, 0x00000B03));
  expect_error<InvalidArgument>([&] { IdxDataset ds(shorts, labels); }, shorts, "not an IDX");
  // Counts that differ.
  const std::string six = put(dir, "six", idx_images(6, 2, 2));
  expect_error<InvalidArgument>([&] { IdxDataset ds(six, labels); }, six, "6 images");
  // Truncated: data cut short, header cut short, zero bytes.
  auto cut = idx_images(5, 2, 2);
  cut.resize(cut.size() - 3);
  const std::string truncated = put(dir, "truncated", cut);
  expect_error<Error>([&] { IdxDataset ds(truncated, labels); }, truncated, "truncated");
  const std::string header = put(dir, "header", {0, 0, 8, 3, 0, 0});
  expect_error<Error>([&] { IdxDataset ds(header, labels); }, header, "truncated");
  const std::string empty = put(dir, "empty", {});
  expect_error<Error>([&] { IdxDataset ds(empty, labels); }, empty, "truncated");
  // Bytes past what the header announces.
  auto longer = idx_images(5, 2, 2);
  longer.push_back(1);
  const std::string trailing = put(dir, "trailing", longer);
  expect_error<Error>([&] { IdxDataset ds(trailing, labels); }, trailing, "bytes past");
  // gzip cut short, and gzip with a corrupt body.
  const auto gz = gzip(idx_images(50, 8, 8));
  const std::string gz_cut = put(dir, "cut.gz", {gz.begin(), gz.begin() + gz.size() / 2});
  expect_error<Error>([&] { read_maybe_gzip(gz_cut); }, gz_cut, "truncated gzip");
  auto bad = gz;
  for (size_t i = 12; i < 40 && i < bad.size(); ++i) bad[i] ^= 0xA7;
  const std::string gz_bad = put(dir, "bad.gz", bad);
  expect_error<Error>([&] { read_maybe_gzip(gz_bad); }, gz_bad, "gzip");
  // Missing file.
  const std::string missing = testing::join(dir.path(), "missing");
  expect_error<Error>([&] { IdxDataset ds(missing, labels); }, missing, "No such file");
}

}  // namespace
}  // namespace tandem::data
