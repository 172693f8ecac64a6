// AugmentedDataset: any dataset whose first field is a (C, H, W) uint8 image, augmented on the
// loader's worker threads by the C++ reference (augment.h) with per-sample parameters drawn on
// the host from (seed, index). The CPU data path a workload chooses instead of a GPU augment
// feed stage: what a PyTorch DataLoader with transforms in its workers does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/augment.h"
#include "tandem/loader.h"

namespace tandem {

/// The image comes out float32 (C, out_h, out_w); the other fields pass through unchanged.
class AugmentedDataset : public Dataset {
 public:
  /// Throws InvalidArgument unless the source's first field is a (C, H, W) uint8 image that
  /// `spec` accepts.
  AugmentedDataset(std::shared_ptr<const Dataset> source, AugmentSpec spec, uint64_t seed);
  int64_t size() const override { return source_->size(); }
  std::vector<FieldSpec> fields() const override;
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;
  std::string sample_source(int64_t index) const override { return source_->sample_source(index); }

 private:
  std::shared_ptr<const Dataset> source_;
  AugmentSpec spec_;
  uint64_t seed_;
  std::vector<FieldSpec> source_fields_;
};

}  // namespace tandem
