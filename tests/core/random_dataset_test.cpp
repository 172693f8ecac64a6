// RandomDataset: fields of the declared shapes and dtypes, values inside their ranges, samples
// a pure function of (seed, index), and every bad field refused with its name.
#include "tandem/random_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tandem/error.h"

namespace tandem {
namespace {

std::vector<at::Tensor> sample(const RandomDataset& d, int64_t index) {
  std::vector<at::Tensor> out;
  for (const FieldSpec& f : d.fields()) out.push_back(at::empty(f.shape, at::dtype(f.dtype)));
  d.get(index, out);
  return out;
}

TEST(RandomDatasetTest, FieldsHaveTheirShapesDtypesAndRanges) {
  const RandomDataset d({{"image", {3, 8, 8}, at::kByte, 0, 256},
                         {"mask", {8, 8}, at::kLong, 0, 10},
                         {"offset", {5}, at::kInt, -3, 4},
                         {"noise", {100}, at::kFloat, -1, 1}},
                        7, 0);
  EXPECT_EQ(d.size(), 7);
  const auto s = sample(d, 3);
  EXPECT_EQ(s[0].sizes(), at::IntArrayRef({3, 8, 8}));
  EXPECT_EQ(s[1].max().item<int64_t>() < 10 && s[1].min().item<int64_t>() >= 0, true);
  EXPECT_GE(s[2].min().item<int32_t>(), -3);
  EXPECT_LT(s[2].max().item<int32_t>(), 4);
  EXPECT_GE(s[3].min().item<float>(), -1.f);
  EXPECT_LT(s[3].max().item<float>(), 1.f);
  EXPECT_GT(s[1].max().item<int64_t>(), s[1].min().item<int64_t>());  // random, not constant
}

TEST(RandomDatasetTest, ASampleDependsOnlyOnSeedAndIndex) {
  const RandomDataset a({{"x", {64}, at::kByte, 0, 256}}, 10, 5);
  const RandomDataset b({{"x", {64}, at::kByte, 0, 256}}, 10, 5);
  const RandomDataset c({{"x", {64}, at::kByte, 0, 256}}, 10, 6);
  EXPECT_TRUE(at::equal(sample(a, 4)[0], sample(b, 4)[0]));
  EXPECT_FALSE(at::equal(sample(a, 4)[0], sample(a, 5)[0]));
  EXPECT_FALSE(at::equal(sample(a, 4)[0], sample(c, 4)[0]));
}

TEST(RandomDatasetTest, BadFieldsAreRefusedByName) {
  auto message = [](std::vector<RandomField> fields) {
    try {
      RandomDataset d(std::move(fields), 1, 0);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"x", {2}, at::kByte, 0, 300}}).find("'x'"), std::string::npos);
  EXPECT_NE(message({{"x", {2}, at::kDouble, 0, 1}}).find("float32"), std::string::npos);
  EXPECT_NE(message({{"y", {-1}, at::kByte, 0, 2}}).find("'y'"), std::string::npos);
  EXPECT_NE(message({{"x", {1}, at::kLong, 2, 2}}).find("high > low"), std::string::npos);
  EXPECT_NE(message({{"x", {1}, at::kLong, 0, 1}, {"x", {1}, at::kLong, 0, 1}}).find("twice"),
            std::string::npos);
  EXPECT_NE(message({{"x", {1}, at::kLong, 0.5, 3}}).find("whole numbers"), std::string::npos);
  EXPECT_NE(message({}).find("at least one field"), std::string::npos);
}

}  // namespace
}  // namespace tandem
