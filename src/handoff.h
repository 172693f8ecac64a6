// A handoff passes a batch from a producer lane to a consumer lane without a host sync, and
// keeps the caching allocator from recycling the batch's memory while the consumer reads it.
#pragma once

#include <ATen/cuda/CUDAEvent.h>

#include <vector>

#include "tandem/detail/batch.h"
#include "tandem/detail/lane.h"

namespace tandem {

/// One edge between two lanes, with a ring of events (one per batch slot in flight):
///
///   producer lane:  ── stage i (item n) ──[record ready[s]]
///                                              │
///   consumer lane:  ── stage i+1 (item n-1) ───[wait ready[s]]── stage i+1 (item n) ──
///
/// receive() also calls CUDACachingAllocator::recordStream(t, consumer) for every CUDA tensor
/// in the batch: the tensor was allocated on the producer's stream, so without it the allocator
/// would hand its block to the producer's next allocation while the consumer still reads it.
/// (The Python loops we replace called record_stream with the *producer's* stream: a no-op.)
/// When producer and consumer share a stream, both calls are no-ops: stream order suffices.
class Handoff {
 public:
  Handoff(Lane producer, Lane consumer, int slots);

  /// On the producer lane, after the producer stage enqueued its work for `batch`.
  void send(const Batch& batch, int slot);
  /// On the consumer lane, before the consumer stage enqueues work that reads `batch`.
  void receive(const Batch& batch, int slot);

  const Lane& producer() const { return producer_; }
  const Lane& consumer() const { return consumer_; }

 private:
  Lane producer_;
  Lane consumer_;
  bool active_;  // false on CPU or when both lanes are one stream
  std::vector<at::cuda::CUDAEvent> ready_;
};

/// recordStream(t, lane) for every CUDA tensor of `batch`: marks their memory as in use by
/// `lane` until the work enqueued there so far completes. A no-op on CPU.
void record_batch_on(const Batch& batch, const Lane& lane);

}  // namespace tandem
