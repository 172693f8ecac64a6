// DistributedSampler: the indices PyTorch's torch.utils.data.DistributedSampler yields for the
// same arguments (expected values printed by torch 2.11's own sampler), and bad arguments named.
#include "tandem/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tandem/error.h"

namespace tandem {
namespace {

using Indices = std::vector<int64_t>;

// list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
// drop_last=drop_last)) after set_epoch(epoch), from Python with torch 2.11.
TEST(SamplerTest, MatchesPyTorchsDistributedSampler) {
  EXPECT_EQ(DistributedSampler(10, 3, 0, true, 7, false).indices(0), (Indices{5, 4, 9, 2}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, true, 7, false).indices(1), (Indices{0, 6, 8, 5}));
  EXPECT_EQ(DistributedSampler(10, 3, 1, false, 0, true).indices(0), (Indices{1, 4, 7}));
  EXPECT_EQ(DistributedSampler(5, 4, 3, true, 0, false).indices(2), (Indices{0, 1}));
  EXPECT_EQ(DistributedSampler(2, 4, 3, false, 0, false).indices(0), (Indices{1}));
  EXPECT_EQ(DistributedSampler(12, 1, 0, true, 3, false).indices(5),
            (Indices{3, 10, 0, 6, 9, 4, 1, 7, 8, 2, 5, 11}));
}

TEST(SamplerTest, RanksPartitionThePaddedEpoch) {
  const int64_t n = 103, world = 4;
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < world; ++rank) {
    const DistributedSampler s(n, world, rank, true, 42);
    const auto idx = s.indices(3);
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), 104);  // padded to a multiple of 4
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << "index " << i;
}

TEST(SamplerTest, EpochsShuffleDifferentlyAndRepeatForTheSameEpoch) {
  const DistributedSampler s(50, 1, 0, true, 1);
  EXPECT_EQ(s.indices(4), s.indices(4));
  EXPECT_NE(s.indices(4), s.indices(5));
  auto sorted = s.indices(4);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
}

TEST(SamplerTest, BadArgumentsAreNamed) {
  EXPECT_THROW(DistributedSampler(-1), InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 0), InvalidArgument);
  try {
    DistributedSampler(10, 2, 2);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "rank 2 is not valid for world size 2: expected 0 to 1");
  }
  EXPECT_THROW(DistributedSampler(10).indices(-1), InvalidArgument);
}

}  // namespace
}  // namespace tandem
