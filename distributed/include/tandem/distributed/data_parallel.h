// Data parallel for any workload: make_data_parallel() broadcasts the trained parameters from
// rank 0 and hangs GradientBuckets on the train stage, which averages the gradients over the
// ranks while backward still runs — bucket by bucket, on a communication lane of its own, so
// the all-reduce of the last layers overlaps the backward of the first. In the graphed modes
// the all-reduce is captured inside the train stage's graph (NCCL collectives are capturable).
//
//   train lane:  backward ── grads of bucket 0 ready ─┬─ … bucket 1 ready ─┬─ … ─ wait ─ step
//                                     record(ready)    │   record(ready)    │        ▲
//   comm lane:                         wait(ready) ─► all-reduce b0 ─► wait ─► b1 ─┴─ record(done)
//
// Feed stages need no communication: they are frozen, and built alike on every rank (the same
// seed). Buffers of the trained modules (BatchNorm's running statistics) stay per rank, as
// DistributedDataParallel(broadcast_buffers=False) keeps them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/detail/gradient_sync.h"
#include "tandem/distributed/process_group.h"
#include "tandem/workload.h"

namespace tandem::distributed {

struct DataParallelOptions {
  /// A bucket's gradients go over the wire together once all are ready (PyTorch DDP's 25 MB).
  double bucket_cap_mb = 25.0;
  /// The first bucket (the last layers, whose gradients come first) is smaller, so
  /// communication starts early in backward (DDP's 1 MB).
  double first_bucket_cap_mb = 1.0;
  /// GatheredGrad layers (gathered_grad.h) form their gradients from the ranks' gathered
  /// batch; false: their gradients are all-reduced in the buckets like every other (to compare).
  bool gathered_grad = true;
};

/// Averages the gradients of `params` over `group`'s ranks during backward. Parameters are
/// bucketed in reverse order (the order backward produces their gradients); each parameter gets
/// a post-accumulate-grad hook, and a bucket whose gradients are all there is all-reduced on the
/// comm lane, buckets strictly in order so every rank issues the same collectives. A parameter
/// that got no gradient in a step gets zeros (every rank must send every bucket). The hooks are
/// removed when this is destroyed. Parameters of a GatheredGrad layer (gathered_grad.h) stay
/// out of the buckets: their layer averages them from every rank's batch (all_gather_batch).
class GradientBuckets : public GradientSync {
 public:
  GradientBuckets(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                  DataParallelOptions options = {});
  ~GradientBuckets() override;
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  void before_backward() override;
  void after_backward() override;
  std::string what() const override;
  int world_size() const override;
  bool gathers_layer_batches() const override;
  /// On the comm lane, in order with the buckets (GatheredGrad's backward calls it).
  std::vector<at::Tensor> all_gather_batch(const std::vector<at::Tensor>& local) override;

  size_t num_buckets() const;
  /// Called by a parameter's hook when its gradient is accumulated (the autograd thread).
  void on_gradient_ready(size_t param);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Makes `workload` data parallel over `group` (nothing to do for a world of 1): the train
/// stage's parameters (its optimizer's) are overwritten with rank 0's, and its gradient_sync
/// set to a GradientBuckets over them. Call it on every rank after building the workload alike
/// there, before the Runner; run with RunOptions::rank/world_size set from the group.
void make_data_parallel(Workload& workload, std::shared_ptr<ProcessGroup> group,
                        DataParallelOptions options = {});

}  // namespace tandem::distributed
