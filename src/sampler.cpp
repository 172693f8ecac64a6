// DistributedSampler: PyTorch's index arithmetic, with LibTorch's own randperm so that the
// shuffle matches Python's bit for bit.
#include "tandem/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "tandem/error.h"

namespace tandem {

DistributedSampler::DistributedSampler(int64_t size, int64_t world_size, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : size_(size),
      world_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  TANDEM_CHECK_ARG(size >= 0, "dataset size ", size, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(world_size >= 1, "world size ", world_size, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(rank >= 0 && rank < world_size, "rank ", rank, " is not valid for world size ",
                   world_size, ": expected 0 to ", world_size - 1);
  num_samples_ = drop_last_ && size_ % world_ != 0 ? (size_ - world_ + world_ - 1) / world_
                                                   : (size_ + world_ - 1) / world_;
  if (num_samples_ < 0) num_samples_ = 0;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  TANDEM_CHECK_ARG(epoch >= 0, "epoch ", epoch, " is not valid: expected >= 0");
  std::vector<int64_t> all(static_cast<size_t>(size_));
  if (shuffle_) {
    // Python: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g)
    at::Generator g =
        at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
    const at::Tensor perm = at::randperm(size_, g, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + size_);
  } else {
    for (int64_t i = 0; i < size_; ++i) all[static_cast<size_t>(i)] = i;
  }
  const int64_t total = num_samples_ * world_;
  if (!drop_last_) {
    // Pad by repeating the list from its start (as often as needed) to a multiple of world.
    for (int64_t i = 0; static_cast<int64_t>(all.size()) < total && size_ > 0; ++i)
      all.push_back(all[static_cast<size_t>(i % size_)]);
  }
  all.resize(static_cast<size_t>(std::min<int64_t>(total, static_cast<int64_t>(all.size()))));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace tandem
