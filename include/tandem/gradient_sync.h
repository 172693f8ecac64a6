// GradientSync: what a data-parallel train step does around backward — the hook by which the
// dist layer (tandem::dist, GradientBuckets) averages gradients over the ranks while backward
// still runs. The core only calls it; it knows nothing of process groups.
//
//   train lane:  zero_grad · forward · loss · before_backward() · backward · after_backward() · step
//                                                 │ (gradients ready, bucket by bucket)
//   comm lane:                                    └─► all-reduce b0 ─► b1 ─► … ─┐
//   train lane waits for the comm lane in after_backward() ◄────────────────────┘
#pragma once

#include <string>

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
};

}  // namespace tandem
