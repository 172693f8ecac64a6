// DistributedSampler: which dataset indices one rank visits in one epoch, with the semantics of
// PyTorch's torch.utils.data.DistributedSampler (the same indices for the same arguments, so a
// tandem job and a PyTorch job shard and shuffle a dataset alike): a permutation drawn per epoch
// from seed + epoch, padded (or cut, with drop_last) to a multiple of the world size, every
// world_size-th index from the rank's offset. With world size 1 it is a seeded shuffle.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

class DistributedSampler {
 public:
  /// Throws InvalidArgument naming the bad value: size < 0, world_size < 1, rank outside
  /// [0, world_size).
  DistributedSampler(int64_t size, int64_t world_size = 1, int64_t rank = 0, bool shuffle = false,
                     uint64_t seed = 0, bool drop_last = false);

  /// The indices rank visits in `epoch`, num_samples() of them: shuffled by torch.randperm
  /// with a CPU generator seeded seed + epoch (PyTorch's set_epoch), else 0, 1, ...; padded by
  /// repeating from the start (or truncated, with drop_last) to num_samples() x world_size.
  std::vector<int64_t> indices(int64_t epoch) const;
  /// Indices per rank per epoch: ceil(size / world) (or, with drop_last and a size the world
  /// does not divide, ceil((size - world) / world)).
  int64_t num_samples() const { return num_samples_; }

 private:
  int64_t size_, world_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

}  // namespace tandem
