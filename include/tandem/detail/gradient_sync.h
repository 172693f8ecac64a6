// GradientSync: what a data-parallel train step does around backward — the hook by which the
// distributed layer (tandem::distributed, GradientBuckets) averages gradients over the ranks
// while backward still runs. The core only calls it; it knows nothing of process groups.
//
//   train lane:  zero_grad · forward · loss · before_backward() · backward · after_backward() ·
//   step
//                                                 │ (gradients ready, bucket by bucket)
//   comm lane:                                    └─► all-reduce b0 ─► b1 ─► … ─┐
//   train lane waits for the comm lane in after_backward() ◄────────────────────┘
//
// A layer may instead form its own weight gradient from every rank's batch (GatheredGrad,
// gathered_grad.h): it asks all_gather_batch() for the ranks' inputs and output gradients during
// backward, and its parameters stay out of the all-reduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tandem {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// On the train lane's thread, before loss.backward(): a step begins (inside the capture where
  /// the mode captures the train step, so what it enqueues must be capture-safe).
  virtual void before_backward() = 0;
  /// After loss.backward(), before the optimizer's step, on the train lane's thread: once the
  /// train lane reaches the work this enqueues, every parameter's gradient is the mean over the
  /// ranks. Capture-safe, like before_backward().
  virtual void after_backward() = 0;
  /// For the runner's notes: "gradients averaged over 2 ranks (NCCL), 4 buckets of <= 25 MB".
  virtual std::string what() const = 0;
  /// How many ranks' gradients are averaged.
  virtual int world_size() const = 0;
  /// Whether GatheredGrad layers form their gradients from the gathered batch (else their
  /// gradients are all-reduced like any other, and all_gather_batch() is not called).
  virtual bool gathers_layer_batches() const = 0;
  /// Every rank's `local` tensors (the same shapes and dtypes on every rank, batch first),
  /// concatenated along dim 0 in rank order: (B, ...) -> (world_size * B, ...). Called during
  /// backward (any thread), in the same order on every rank; in order with the gradients'
  /// all-reduces, capture-safe; the current stream's later work sees the result.
  virtual std::vector<at::Tensor> all_gather_batch(const std::vector<at::Tensor>& local) = 0;

  /// The train stage's sync while its forward runs on this thread (the Runner sets it with a
  /// Scope around the loss function), else nullptr: how a layer inside the model finds it.
  static GradientSync* current();
  class Scope {
   public:
    explicit Scope(GradientSync* sync);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GradientSync* previous_;
  };
};

}  // namespace tandem
