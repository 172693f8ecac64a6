// ImageMaskPairs: pairing by stem, joint resize + crop (nearest for masks), and the bad inputs
// (unpaired files, ids out of range, sizes that differ, missing folders).
#include "tandem/data/image_mask_pairs.h"

#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <functional>

#include "fixtures.h"
#include "tandem/data/decode.h"
#include "tandem/data/resize.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

using testing::put;
using testing::RawPng;
using testing::smooth_image;
using testing::TempDir;

// A palette mask (VOC style): id = band of columns (0, 1, 2), and a 255 border on row 0.
std::vector<uint8_t> band_mask(int height, int width, int bad_id = -1) {
  RawPng png;
  png.width = width;
  png.height = height;
  png.color_type = PNG_COLOR_TYPE_PALETTE;
  png.palette.assign(256, png_color{0, 0, 0});
  for (int y = 0; y < height; ++y) {
    std::vector<uint8_t> row;
    for (int x = 0; x < width; ++x)
      row.push_back(y == 0 ? 255 : static_cast<uint8_t>(3 * x / width));
    png.rows.push_back(row);
  }
  if (bad_id >= 0) png.rows[height / 2][width / 2] = static_cast<uint8_t>(bad_id);
  return testing::raw_png(png);
}

std::vector<at::Tensor> pair_slots_for(const Dataset& ds) {
  std::vector<at::Tensor> out;
  for (const FieldSpec& f : ds.fields()) out.push_back(at::full(f.shape, 0, f.dtype));
  return out;
}

std::string invalid_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument";
  return "";
}

TEST(ImageMaskPairsTest, PairsByStemAndResizesImageAndMaskTogether) {
  TempDir dir;
  put(dir, "images/b.JPG", encode_jpeg(smooth_image(3, 60, 90, 1), 90));
  put(dir, "images/a.png", encode_png(smooth_image(3, 40, 30, 2)));
  put(dir, "images/notes.txt", {'x'});
  put(dir, "masks/a.png", band_mask(40, 30));
  put(dir, "masks/b.png", band_mask(60, 90));
  const ImageMaskPairs ds(dir.path(), {24, 3, 255});
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.pairs()[0].stem, "a");
  EXPECT_EQ(ds.pairs()[1].stem, "b");
  EXPECT_EQ(ds.pairs()[1].image_path, testing::join(dir.path(), "images/b.JPG"));
  const auto fields = ds.fields();
  EXPECT_EQ(fields[0].shape, (std::vector<int64_t>{3, 24, 24}));
  EXPECT_EQ(fields[1].name, "mask");
  EXPECT_EQ(fields[1].shape, (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(fields[1].dtype, at::kLong);

  auto out = pair_slots_for(ds);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto& pair = ds.pairs()[i];
    ds.get(i, out);
    const auto image_bytes = read_file(pair.image_path);
    const ImageInfo info = read_image_info(image_bytes, pair.image_path);
    const auto target = resized_shape(info.height, info.width, 24);
    const at::Tensor image_ref = center_crop(
        resize_bilinear(decode_image(image_bytes, pair.image_path, 3, target[0], target[1]),
                        target[0], target[1]),
        24);
    const at::Tensor mask_ref =
        center_crop(resize_nearest(decode_mask(read_file(pair.mask_path), pair.mask_path),
                                   target[0], target[1]),
                    24);
    EXPECT_TRUE(out[0].equal(image_ref)) << pair.image_path;
    EXPECT_TRUE(out[1].equal(mask_ref)) << pair.mask_path;
    // Only ids that exist in the file: nearest never blends.
    const at::Tensor m = out[1];
    EXPECT_TRUE(
        m.eq(0).logical_or(m.eq(1)).logical_or(m.eq(2)).logical_or(m.eq(255)).all().item<bool>());
  }
  // b is 90 x 60 -> 36 x 24 -> columns 6..29 of the resized mask: bands 0 | 1 | 2 all present.
  ds.get(1, out);
  for (int64_t id : {0, 1, 2}) EXPECT_TRUE(out[1].eq(id).any().item<bool>()) << id;
}

TEST(ImageMaskPairsTest, UnpairedFilesAreListed) {
  TempDir dir;
  const auto png = encode_png(smooth_image(3, 8, 8));
  for (const char* stem : {"a", "b", "c", "d", "e", "f", "g"}) {
    put(dir, std::string("images/") + stem + ".png", png);
    if (std::string(stem) < "c") put(dir, std::string("masks/") + stem + ".png", band_mask(8, 8));
  }
  put(dir, "masks/orphan.png", band_mask(8, 8));
  const std::string message = invalid_message([&] { (void)ImageMaskPairs(dir.path(), {8, 3}); });
  EXPECT_NE(message.find("5 image(s) have no mask (c, d, e, f, g)"), std::string::npos) << message;
  EXPECT_NE(message.find("1 mask(s) have no image (orphan)"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;

  put(dir, "masks/x.png", band_mask(8, 8));
  put(dir, "masks/y.png", band_mask(8, 8));
  put(dir, "masks/z.png", band_mask(8, 8));
  put(dir, "masks/w.png", band_mask(8, 8));
  put(dir, "masks/v.png", band_mask(8, 8));
  const std::string many = invalid_message([&] { (void)ImageMaskPairs(dir.path(), {8, 3}); });
  EXPECT_NE(many.find("6 mask(s) have no image (orphan, v, w, x, y, ...)"), std::string::npos)
      << many;
}

TEST(ImageMaskPairsTest, BadFoldersAndOptionsAreRejected) {
  TempDir dir;
  const std::string root = dir.path();
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root + "/nope", {8, 3});
            }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root, {8, 3});
            }).find("images"),
            std::string::npos);
  put(dir, "images/a.png", encode_png(smooth_image(3, 8, 8)));
  put(dir, "masks", {'x'});  // a file where the folder should be
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root, {8, 3});
            }).find("not a folder"),
            std::string::npos);
  ::remove(testing::join(dir.path(), "masks").c_str());
  put(dir, "masks/a.png", band_mask(8, 8));
  put(dir, "images/a.jpg", encode_jpeg(smooth_image(3, 8, 8), 90));
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root, {8, 3});
            }).find("two files with the stem 'a'"),
            std::string::npos);
  ::remove(testing::join(dir.path(), "images/a.jpg").c_str());
  EXPECT_NO_THROW((void)ImageMaskPairs(root, {8, 3}));
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root, {8, 0});
            }).find("classes"),
            std::string::npos);
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(root, {0, 3});
            }).find("image_size"),
            std::string::npos);
  TempDir empty;
  testing::make_dirs(testing::join(empty.path(), "images"));
  testing::make_dirs(testing::join(empty.path(), "masks"));
  EXPECT_NE(invalid_message([&] {
              (void)ImageMaskPairs(empty.path(), {8, 3});
            }).find("no image"),
            std::string::npos);
}

TEST(ImageMaskPairsTest, BadMasksFailInGetNamingTheFileAndTheValue) {
  TempDir dir;
  const auto image = encode_png(smooth_image(3, 20, 30));
  put(dir, "images/0_ok.png", image);
  put(dir, "masks/0_ok.png", band_mask(20, 30));
  put(dir, "images/1_id.png", image);
  const std::string bad_id = put(dir, "masks/1_id.png", band_mask(20, 30, /*bad_id=*/7));
  put(dir, "images/2_size.png", image);
  const std::string small = put(dir, "masks/2_size.png", band_mask(10, 30));
  put(dir, "images/3_rgb.png", image);
  const std::string rgb = put(dir, "masks/3_rgb.png", encode_png(smooth_image(3, 20, 30)));
  put(dir, "images/4_trunc.png", image);
  const auto mask = band_mask(20, 30);
  const std::string trunc =
      put(dir, "masks/4_trunc.png", {mask.begin(), mask.begin() + mask.size() / 2});
  const std::string bad_image = put(dir, "images/5_img.png", {});
  put(dir, "masks/5_img.png", band_mask(20, 30));

  const ImageMaskPairs ds(dir.path(), {16, 3, 255});
  auto out = pair_slots_for(ds);
  EXPECT_NO_THROW(ds.get(0, out));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {bad_id, "mask value 7"},
      {small, "30 x 10"},
      {rgb, "gray or palette"},
      {trunc, "corrupt or truncated PNG"},
      {bad_image, "empty file"}};
  for (size_t k = 0; k < expected.size(); ++k) {
    try {
      ds.get(static_cast<int64_t>(k) + 1, out);
      ADD_FAILURE() << "no error for " << expected[k].first;
    } catch (const InvalidArgument& e) {
      ADD_FAILURE() << e.what();
    } catch (const Error& e) {
      testing::expect_one_line_naming(e.what(), expected[k].first, expected[k].second);
    }
  }
  // 7 is fine with 8 classes; 255 is fine only as the ignore index.
  const ImageMaskPairs wide(dir.path(), {16, 8, 255});
  EXPECT_NO_THROW(wide.get(1, out));
  const ImageMaskPairs no_ignore(dir.path(), {16, 8, 254});
  EXPECT_THROW(no_ignore.get(0, out), Error);
}

}  // namespace
}  // namespace tandem::data
