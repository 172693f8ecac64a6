// The device collectives a ProcessGroup runs (internal to tandem::distributed): NCCL on CUDA, the
// store on the CPU. Both average in place and broadcast in place; both are called by every rank
// in the same order (the contract of ProcessGroup::all_reduce_mean_).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tandem::distributed {

/// Every rank's bytes for one round, through the store: exchange() sets this rank's key of the
/// round and reads the others' in rank order. A rank deletes its key of round n-2 in round n:
/// by then every rank has written round n-1, so it has read round n-2. Thread-safe; the rounds
/// must be called in the same order on every rank.
class StoreExchange {
 public:
  /// `where` names the store in errors: "127.0.0.1:29500 (rank 0)".
  StoreExchange(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int world,
                std::string where);
  std::vector<std::vector<uint8_t>> exchange(const std::vector<uint8_t>& mine);
  /// Rank root's bytes on every rank.
  std::vector<uint8_t> broadcast(const std::vector<uint8_t>& mine, int root);
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, world_;
  std::string where_;
  int64_t round_ = 0;
  size_t chunks_sent_[2] = {0, 0};  // this rank's chunks in the last two rounds, for deletion
  static constexpr size_t kChunkBytes = 4u << 20;
  std::mutex mu_;
};

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual void all_reduce_mean_(const std::vector<at::Tensor>& tensors) = 0;
  virtual void broadcast_(const std::vector<at::Tensor>& tensors, int root) = 0;
  /// ProcessGroup::all_gather_, its arguments checked.
  virtual void all_gather_(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs) = 0;
  virtual std::string name() const = 0;
  /// Leaves cleanly (finish) or tears down without waiting for peers (abort: a failed run).
  virtual void shutdown(bool abort) {}
};

/// Collectives over `exchange`: the tensors (any device) are copied to the host, summed in rank
/// order, divided and copied back — the same bits on every rank.
std::unique_ptr<DeviceCollectives> make_store_collectives(std::shared_ptr<StoreExchange> exchange);
/// NCCL over CUDA `device`: rank 0's unique id travels through `store` under `key`. Throws
/// tandem::Error where tandem was built without NCCL.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(c10d::Store& store, const std::string& key,
                                                         int rank, int world, c10::Device device);

}  // namespace tandem::distributed
