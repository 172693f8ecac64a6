// The loader's variable-size fields (packed into the slot with per-sample offsets and sizes, the
// slot growing when a batch needs more) and skip_bad (bad samples left out, counted, reported).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tandem/error.h"
#include "tandem/loader.h"

namespace tandem {
namespace {

// Sample i: an image (1, 1 + i % 5, 2 + (i * big) % 7) of bytes (i + y + x) % 251, label i;
// indices in `bad` throw.
class RaggedDataset : public Dataset {
 public:
  RaggedDataset(int64_t size, std::set<int64_t> bad = {}, int64_t big = 1)
      : size_(size), bad_(std::move(bad)), big_(big) {}
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override {
    return {{"image", {1, 2, 2}, at::kByte, true}, {"label", {}, at::kLong}};
  }
  static std::array<int64_t, 2> shape_of(int64_t i, int64_t big) {
    return {1 + i % 5, 2 + (i * big) % 7};
  }
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override {
    if (bad_.count(index))
      throw std::runtime_error("file " + std::to_string(index) + ".jpg is truncated");
    EXPECT_FALSE(out[0].defined());  // a variable-size field comes undefined
    const auto hw = shape_of(index, big_);
    at::Tensor img = at::empty({1, hw[0], hw[1]}, at::kByte);
    for (int64_t y = 0; y < hw[0]; ++y)
      for (int64_t x = 0; x < hw[1]; ++x)
        img[0][y][x] = static_cast<uint8_t>((index + y + x) % 251);
    out[0] = img;
    out[1].fill_(index);
  }

 private:
  int64_t size_;
  std::set<int64_t> bad_;
  int64_t big_;
};

// Every sample of every batch, rebuilt from the packed field: checks values, returns indices.
std::vector<int64_t> drain_ragged(Loader& loader, int64_t big,
                                  std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> seen;
  while (auto b = loader.next()) {
    const at::Tensor packed = b->fields[0], offsets = b->fields[1], sizes = b->fields[2],
                     labels = b->fields[3];
    const int64_t B = labels.size(0);
    if (batch_sizes) batch_sizes->push_back(B);
    EXPECT_EQ(offsets.size(0), B);
    EXPECT_EQ(sizes.sizes(), (std::vector<int64_t>{B, 3}));
    int64_t expected_offset = 0;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t index = labels[i].item<int64_t>();
      EXPECT_EQ(index, b->indices[i]);
      const auto hw = RaggedDataset::shape_of(index, big);
      EXPECT_EQ(sizes[i][0].item<int64_t>(), 1);
      EXPECT_EQ(sizes[i][1].item<int64_t>(), hw[0]);
      EXPECT_EQ(sizes[i][2].item<int64_t>(), hw[1]);
      EXPECT_EQ(offsets[i].item<int64_t>(), expected_offset) << "samples are packed back to back";
      const at::Tensor img = packed.narrow(0, expected_offset, hw[0] * hw[1]).view({hw[0], hw[1]});
      for (int64_t y = 0; y < hw[0]; ++y)
        for (int64_t x = 0; x < hw[1]; ++x)
          EXPECT_EQ(img[y][x].item<uint8_t>(), (index + y + x) % 251) << "sample " << index;
      expected_offset += hw[0] * hw[1];
      seen.push_back(index);
    }
    EXPECT_EQ(packed.numel(), expected_offset) << "the packed field holds exactly the batch";
    loader.release(*b);
  }
  return seen;
}

LoaderOptions loader_options(int64_t batch_size, int workers, int depth) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.workers = workers;
  o.depth = depth;
  return o;
}

TEST(PackedLoaderTest, VariableSizeSamplesArePackedWithTheirOffsetsAndSizes) {
  auto ds = std::make_shared<RaggedDataset>(53);
  LoaderOptions o = loader_options(6, 3, 4);
  o.drop_last = false;
  Loader loader(ds, o);
  std::vector<std::string> names;
  for (const auto& f : loader.fields()) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"image", "image_offsets", "image_sizes", "label"}));
  const auto seen = drain_ragged(loader, 1);
  ASSERT_EQ(seen.size(), 53u);
  for (int64_t i = 0; i < 53; ++i) EXPECT_EQ(seen[i], i);
}

TEST(PackedLoaderTest, ASlotGrowsWhenABatchOutgrowsTheTypicalSize) {
  // Typical 1x2x2 = 4 bytes a sample, but samples reach 5 x 8: every slot must grow.
  auto ds = std::make_shared<RaggedDataset>(40, std::set<int64_t>{}, 3);
  Loader loader(ds, loader_options(8, 2, 2));
  EXPECT_EQ(drain_ragged(loader, 3).size(), 40u);
}

// A slot's arena that the next batch outgrows is freed by the consumer's next(), not by the
// worker that grew the slot: freeing pinned memory records an event on each stream that copied
// from it, and a worker's record on a stream another thread is capturing a CUDA graph on would
// land inside that graph.
TEST(PackedLoaderTest, AnOutgrownArenaIsFreedByTheConsumerNotByAWorker) {
  // Batch 0 (samples 0, 1) packs 12 bytes, batch 1 (samples 2, 3) 40: the one slot grows.
  auto ds = std::make_shared<RaggedDataset>(4, std::set<int64_t>{}, 3);
  Loader loader(ds, loader_options(2, 1, 1));
  std::optional<HostBatch> first = loader.next();
  ASSERT_TRUE(first.has_value());
  const c10::weak_intrusive_ptr<c10::StorageImpl> arena =
      first->fields[0].storage().getWeakStorageImpl();
  loader.release(*first);
  first.reset();
  // The worker refills the slot with batch 1 meanwhile (this waits for it rather than for a
  // signal the loader does not give; a slower worker only leaves less to check).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(arena.expired()) << "the worker freed the arena it outgrew";
  std::optional<HostBatch> second = loader.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_TRUE(arena.expired()) << "next() frees the arena its batch outgrew";
  EXPECT_EQ(second->indices, (std::vector<int64_t>{2, 3}));
  loader.release(*second);
}

TEST(PackedLoaderTest, PackedFieldsExpandsOnlyVariableSizeFields) {
  const auto f = packed_fields({{"a", {3}, at::kFloat}, {"img", {3, 4, 5}, at::kByte, true}});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[1].name, "img");
  EXPECT_EQ(f[1].shape, (std::vector<int64_t>{60}));
  EXPECT_EQ(f[2].name, offsets_field("img"));
  EXPECT_EQ(f[3].name, sizes_field("img"));
  EXPECT_EQ(f[3].shape, (std::vector<int64_t>{3}));
}

TEST(PackedLoaderTest, WithoutSkipBadABadSampleFailsItsBatchNamingItAndTheCause) {
  auto ds = std::make_shared<RaggedDataset>(20, std::set<int64_t>{9});
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  Loader loader(ds, o);
  int64_t good = 0;
  try {
    while (auto b = loader.next()) {
      ++good;
      loader.release(*b);
    }
    FAIL() << "no error";
  } catch (const LoaderError& e) {
    EXPECT_NE(std::string(e.what()).find("sample 9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9.jpg is truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(good, 2);
}

TEST(PackedLoaderTest, SkipBadLeavesBadSamplesOutAndReportsThem) {
  auto ds = std::make_shared<RaggedDataset>(20, std::set<int64_t>{1, 9, 10});
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 3;
  o.skip_bad = true;
  Loader loader(ds, o);
  std::vector<int64_t> sizes;
  const auto seen = drain_ragged(loader, 1, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 4, 2, 4, 4}));
  EXPECT_EQ(seen.size(), 17u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).count(9), 0u);
  auto skipped = loader.skipped();
  std::sort(skipped.begin(), skipped.end(),
            [](const SkippedSample& a, const SkippedSample& b) { return a.index < b.index; });
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_EQ(skipped[0].index, 1);
  EXPECT_EQ(skipped[1].index, 9);
  EXPECT_EQ(skipped[2].index, 10);
  EXPECT_NE(skipped[1].reason.find("9.jpg is truncated"), std::string::npos) << skipped[1].reason;
}

TEST(PackedLoaderTest, ABatchWithNoGoodSampleIsAnErrorEvenWithSkipBad) {
  auto ds = std::make_shared<RaggedDataset>(8, std::set<int64_t>{4, 5, 6, 7});
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  o.skip_bad = true;
  Loader loader(ds, o);
  auto first = loader.next();
  ASSERT_TRUE(first.has_value());
  loader.release(*first);
  try {
    loader.next();
    FAIL() << "no error";
  } catch (const LoaderError& e) {
    EXPECT_NE(std::string(e.what()).find("every sample of batch 1 was bad"), std::string::npos)
        << e.what();
  }
}

// A dataset that declares a variable-size field but returns a tensor of the wrong rank.
class WrongRankDataset : public Dataset {
 public:
  int64_t size() const override { return 4; }
  std::vector<FieldSpec> fields() const override { return {{"image", {3, 8, 8}, at::kByte, true}}; }
  void get_sample(int64_t, std::vector<at::Tensor>& out) const override {
    out[0] = at::zeros({8, 8}, at::kByte);
  }
};

TEST(PackedLoaderTest, AVariableSizeTensorOfTheWrongRankIsNamed) {
  LoaderOptions o;
  o.batch_size = 2;
  o.workers = 1;
  Loader loader(std::make_shared<WrongRankDataset>(), o);
  try {
    loader.next();
    FAIL() << "no error";
  } catch (const LoaderError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'image'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 dimensions"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
