// safetensors: a file as the format's spec (and Python's save_file) lays it out reads back, every
// dtype round-trips, a ResNet's weights move between instances by name, and bad files, bad
// weights and failed writes are errors that name the problem.
#include "tandem/models/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/utils.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tandem/error.h"
#include "tandem/models/resnet.h"

namespace tandem::models {
namespace {

std::string temp_path(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/tandem_st_XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return dir + "/" + name;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The layout by hand: 8-byte little-endian length, JSON, data.
std::string file_bytes(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(SafetensorsTest, AFileLaidOutByTheSpecReadsBack) {
  const std::string path = temp_path("spec.safetensors");
  const float values[] = {1.5f, -2.0f};
  const int64_t ids[] = {7, 8, 9};
  std::string data(reinterpret_cast<const char*>(values), 8);
  data.append(reinterpret_cast<const char*>(ids), 24);
  write_bytes(path, file_bytes(R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],)"
                               R"("data_offsets":[0,8]},"ids":{"dtype":"I64","shape":[1,3],)"
                               R"("data_offsets":[8,32]}})",
                               data));
  const NamedTensors t = load_safetensors(path);
  ASSERT_EQ(t.size(), 2u);
  for (const auto& [name, tensor] : t) {
    if (name == "w")
      EXPECT_TRUE(at::equal(tensor, at::tensor({1.5f, -2.0f})));
    else
      EXPECT_TRUE(at::equal(tensor, at::tensor({7, 8, 9}, at::kLong).view({1, 3}))) << name;
  }
}

TEST(SafetensorsTest, EveryDtypeRoundTripsWithMetadata) {
  const std::string path = temp_path("all.safetensors");
  at::manual_seed(1);
  const NamedTensors in{{"f32", at::randn({3, 4})},
                        {"bf16", at::randn({5}).to(at::kBFloat16)},
                        {"f16", at::randn({2, 2}).to(at::kHalf)},
                        {"f64", at::randn({1}).to(at::kDouble)},
                        {"i64", at::arange(6, at::kLong).view({2, 3})},
                        {"i32", at::arange(3, at::kInt)},
                        {"u8", at::arange(200, at::kByte)},
                        {"bool", at::arange(3, at::kInt).eq(1)},
                        {"scalar", at::tensor(3.25f).view({})},
                        {"empty", at::empty({0, 4})},
                        {"strided", at::randn({4, 6}).t()}};
  save_safetensors(path, in, {{"format", "pt"}});
  const NamedTensors out = load_safetensors(path);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, tensor] : in) {
    bool found = false;
    for (const auto& [n, t] : out)
      if (n == name) {
        found = true;
        EXPECT_EQ(t.scalar_type(), tensor.scalar_type()) << name;
        EXPECT_TRUE(at::equal(t, tensor)) << name;
      }
    EXPECT_TRUE(found) << name;
  }
  // The header is padded so the data starts 8-byte aligned, as the format asks.
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(SafetensorsTest, AResNetsWeightsMoveToAnotherInstanceByName) {
  const std::string path = temp_path("r18.safetensors");
  torch::manual_seed(1);
  ResNet a = resnet18(ResNetOptions{10});
  torch::manual_seed(2);
  ResNet b = resnet18(ResNetOptions{10});
  a->eval();
  b->eval();
  const at::Tensor x = at::randn({2, 3, 32, 32});
  EXPECT_FALSE(at::equal(a->forward(x), b->forward(x)));
  save_safetensors(path, state_dict(*a));
  const NamedTensors loaded = load_safetensors(path);
  EXPECT_EQ(loaded.size(), 122u);  // torchvision's resnet18 state_dict
  load_state_dict(*b, loaded);
  EXPECT_TRUE(at::equal(a->forward(x), b->forward(x)));
}

TEST(SafetensorsTest, WeightsThatDoNotFitAreListedAndNothingIsCopied) {
  ResNet r18 = resnet18(ResNetOptions{10});
  ResNet r34 = resnet34(ResNetOptions{10});
  const at::Tensor before = r34->conv1->weight.clone();
  const std::string m = error_of([&] { load_state_dict(*r34, state_dict(*resnet18())); });
  EXPECT_NE(m.find("missing: layer1.2.conv1.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("of another shape: fc.weight (file [1000, 512], model [10, 512])"),
            std::string::npos)
      << m;
  EXPECT_TRUE(at::equal(before, r34->conv1->weight)) << "nothing copied on error";
  NamedTensors extra = state_dict(*r18);
  extra.emplace_back("head.weight", at::zeros({1}));
  const std::string u = error_of([&] { load_state_dict(*r18, extra); });
  EXPECT_NE(u.find("1 unexpected: head.weight"), std::string::npos) << u;
  EXPECT_NO_THROW(load_state_dict(*r18, extra, /*strict=*/false));
}

TEST(SafetensorsTest, BadFilesAreNamedWithTheProblem) {
  const std::string path = temp_path("bad.safetensors");
  auto message = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return error_of([&] { load_safetensors(path); });
  };
  EXPECT_NE(message("abc").find("shorter than the 8-byte header length"), std::string::npos);
  EXPECT_NE(message(file_bytes("{}", "")).find("no error"), std::string::npos);
  std::string cut = file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234");
  EXPECT_NE(message(cut).find("outside the file's 4 data bytes"), std::string::npos)
      << message(cut);
  std::string wrong =
      file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_NE(message(wrong).find("needs 12 bytes but its range holds 8"), std::string::npos);
  std::string dtype =
      file_bytes(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_NE(message(dtype).find("dtype C64"), std::string::npos);
  EXPECT_NE(message(file_bytes("{not json", "")).find("header is not JSON"), std::string::npos);
  std::string huge(8, '\xff');
  EXPECT_NE(message(huge).find("truncated, or not a safetensors file"), std::string::npos);
  const std::string m = error_of([] { load_safetensors("/nonexistent/w.safetensors"); });
  EXPECT_NE(m.find("/nonexistent/w.safetensors"), std::string::npos) << m;
  EXPECT_NE(m.find("No such file"), std::string::npos) << m;
}

TEST(SafetensorsTest, AFailedSaveLeavesThePreviousFileAsItWas) {
  const std::string path = temp_path("keep.safetensors");
  save_safetensors(path, {{"w", at::ones({2})}});
  EXPECT_THROW(save_safetensors(path, {{"w", at::ones({2})}, {"w", at::ones({2})}}),
               InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}), InvalidArgument);
  EXPECT_TRUE(at::equal(load_safetensors(path).at(0).second, at::ones({2})));
  const std::string m = error_of([] {
    save_safetensors("/nonexistent/dir/w.safetensors", {{"w", at::ones({1})}});
  });
  EXPECT_NE(m.find("/nonexistent/dir/w.safetensors.tmp"), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem::models
