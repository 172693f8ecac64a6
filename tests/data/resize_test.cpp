// resize.h: torchvision's Resize(size) + CenterCrop(size) arithmetic, checked on hand-computed
// cases (antialiased bilinear, half-to-even crop offsets) and against ATen's nearest.
#include "tandem/data/resize.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/upsample_nearest2d.h>
#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

#include "fixtures.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

at::Tensor u8(std::vector<int64_t> values, std::vector<int64_t> shape) {
  return at::tensor(values, at::kLong).to(at::kByte).view(shape);
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor flat = t.to(at::kLong).contiguous().view(-1);
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

TEST(ResizeTest, ResizedShapeMatchesTorchvision) {
  using Shape = std::array<int64_t, 2>;
  EXPECT_EQ(resized_shape(480, 640, 224), (Shape{224, 298}));  // int(224 * 640 / 480) = 298
  EXPECT_EQ(resized_shape(640, 480, 224), (Shape{298, 224}));
  EXPECT_EQ(resized_shape(100, 100, 224), (Shape{224, 224}));
  EXPECT_EQ(resized_shape(3, 7, 2), (Shape{2, 4}));  // int(4.67)
  EXPECT_EQ(resized_shape(375, 500, 256), (Shape{256, 341}));
  EXPECT_THROW(resized_shape(0, 5, 2), InvalidArgument);
  EXPECT_THROW(resized_shape(5, 5, 0), InvalidArgument);
}

TEST(ResizeTest, BilinearAntialiasMatchesHandComputedValues) {
  // Shrinking 4 -> 2 with antialias (PIL's triangle filter, support 2): weights 3/7 3/7 1/7 and
  // 1/7 3/7 3/7, so [0 40 80 120] -> [200/7, 640/7] = [28.57, 91.43] -> [29, 91]. (Without
  // antialias it would be [20, 100].)
  EXPECT_EQ(values(resize_bilinear(u8({0, 40, 80, 120}, {1, 1, 4}), 1, 2)),
            (std::vector<int64_t>{29, 91}));
  // Growing 2 -> 4 is plain bilinear, align_corners = false: [0 100] -> [0 25 75 100].
  EXPECT_EQ(values(resize_bilinear(u8({0, 100}, {1, 1, 2}), 1, 4)),
            (std::vector<int64_t>{0, 25, 75, 100}));
  // Any shape: within 1 of torchvision's float path (interpolate in float, clamp, round).
  const at::Tensor photo = testing::smooth_image(3, 37, 53, 6);
  for (const auto& [h, w] :
       std::vector<std::pair<int64_t, int64_t>>{{16, 23}, {80, 41}, {37, 20}}) {
    const at::Tensor ref = at::_upsample_bilinear2d_aa(photo.to(at::kFloat).unsqueeze(0), {h, w},
                                                       /*align_corners=*/false)
                               .squeeze(0)
                               .clamp(0, 255)
                               .round();
    const at::Tensor out = resize_bilinear(photo, h, w);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, h, w}));
    EXPECT_LE(out.to(at::kFloat).sub(ref).abs().max().item<float>(), 1.0f) << h << "x" << w;
  }
  // Same size: untouched.
  const at::Tensor image = testing::smooth_image(3, 9, 11);
  EXPECT_TRUE(resize_bilinear(image, 9, 11).equal(image));
}

TEST(ResizeTest, CenterCropRoundsOffsetsHalfToEven) {
  const at::Tensor row = at::arange(7, at::kLong).view({1, 1, 7});
  // excess 1 -> round(0.5) = 0; excess 3 -> round(1.5) = 2; excess 5 -> round(2.5) = 2.
  EXPECT_EQ(values(center_crop(at::arange(3, at::kLong).view({1, 3}).expand({2, 3}), 2)),
            (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(values(center_crop(at::arange(5, at::kLong).view({1, 5}).expand({2, 5}), 2)),
            (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_EQ(values(center_crop(at::arange(7, at::kLong).view({1, 7}).expand({2, 7}), 2)),
            (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_EQ(
      values(center_crop(at::arange(4, at::kLong).view({4, 1}).expand({4, 4}), 2).narrow(1, 0, 1)),
      (std::vector<int64_t>{1, 2}));
  EXPECT_THROW(center_crop(row, 2), InvalidArgument);  // 1 row < 2
}

TEST(ResizeTest, ResizeCenterCropIsResizeThenCrop) {
  // (1, 2, 4) at size 2: the shorter side is already 2, so no resize; crop columns 1..2.
  const at::Tensor small = u8({10, 20, 30, 40, 50, 60, 70, 80}, {1, 2, 4});
  EXPECT_EQ(values(resize_center_crop(small, 2)), (std::vector<int64_t>{20, 30, 60, 70}));

  const at::Tensor image = testing::smooth_image(3, 60, 90, 2);
  const at::Tensor out = resize_center_crop(image, 32);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_TRUE(out.equal(center_crop(resize_bilinear(image, 32, 48), 32)));
}

TEST(ResizeTest, ImagesSmallerThanTheSizeAreScaledUp) {
  const at::Tensor flat = at::full({3, 10, 20}, 77, at::kByte);
  const at::Tensor out = resize_center_crop(flat, 32);  // -> 32 x 64, then 32 x 32
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_TRUE(out.equal(at::full({3, 32, 32}, 77, at::kByte)));
  EXPECT_EQ(resize_center_crop(testing::smooth_image(1, 1, 1), 5).sizes().vec(),
            (std::vector<int64_t>{1, 5, 5}));
}

TEST(ResizeTest, NearestMatchesATenAndNeverBlendsIds) {
  const std::vector<std::array<int64_t, 4>> cases = {
      {7, 9, 3, 4}, {5, 6, 13, 11}, {4, 4, 8, 8}, {6, 7, 6, 7}, {9, 10, 4, 3}, {3, 5, 224, 298}};
  for (const auto& [h, w, oh, ow] : cases) {
    const at::Tensor ids = at::arange(h * w, at::kLong).remainder(17).view({h, w});
    const at::Tensor out = resize_nearest(ids, oh, ow);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{oh, ow}));
    EXPECT_EQ(out.scalar_type(), at::kLong);
    const at::Tensor ref =
        at::upsample_nearest2d(ids.to(at::kFloat).view({1, 1, h, w}), {oh, ow}).view({oh, ow});
    EXPECT_TRUE(out.equal(ref.to(at::kLong))) << h << "x" << w << " -> " << oh << "x" << ow;
  }
  const at::Tensor chw = testing::smooth_image(3, 8, 8);
  EXPECT_EQ(resize_nearest(chw, 4, 16).sizes().vec(), (std::vector<int64_t>{3, 4, 16}));
  EXPECT_THROW(resize_nearest(at::full({5}, 1, at::kLong), 2, 2), InvalidArgument);
}

TEST(ResizeTest, BadInputsAreInvalidArguments) {
  EXPECT_THROW(resize_center_crop(at::full({3, 4, 4}, 1.0f), 2), InvalidArgument);
  EXPECT_THROW(resize_center_crop(testing::smooth_image(3, 4, 4), 0), InvalidArgument);
  EXPECT_THROW(resize_center_crop(testing::smooth_image(3, 4, 4).view({3, 16}), 2),
               InvalidArgument);
  EXPECT_THROW(resize_bilinear(testing::smooth_image(3, 4, 4), 0, 3), InvalidArgument);
}

}  // namespace
}  // namespace tandem::data
