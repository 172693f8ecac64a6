// AugmentedDataset: the C++ reference augmentation run per sample by the loader's workers.
#include "tandem/augmented_dataset.h"

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem {

AugmentedDataset::AugmentedDataset(std::shared_ptr<const Dataset> source, AugmentSpec spec,
                                   uint64_t seed)
    : source_(std::move(source)), spec_(std::move(spec)), seed_(seed) {
  TANDEM_CHECK_ARG(source_ != nullptr, "AugmentedDataset needs a source dataset");
  source_fields_ = source_->fields();
  TANDEM_CHECK_ARG(!source_fields_.empty() && source_fields_[0].dtype == at::kByte &&
                       source_fields_[0].shape.size() == 3,
                   "AugmentedDataset needs a source whose first field is a (C, H, W) uint8 image");
  const auto& s = source_fields_[0].shape;
  spec_.validate(s[0], s[1], s[2]);
}

std::vector<FieldSpec> AugmentedDataset::fields() const {
  std::vector<FieldSpec> f = source_fields_;
  f[0].shape = {f[0].shape[0], spec_.out_h, spec_.out_w};
  f[0].dtype = at::kFloat;
  return f;
}

void AugmentedDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  // The raw image goes to a per-call buffer; the other fields straight to the slot.
  std::vector<at::Tensor> raw = out;
  raw[0] = at::empty(source_fields_[0].shape, at::kByte);
  source_->get(index, raw);
  const auto& s = source_fields_[0].shape;
  const AugmentParams p = draw_augment_params_host(spec_, s[1], s[2], seed_, index);
  at::Tensor image = out[0];
  augment_sample_cpu(raw[0], p, 0, spec_, image);
}

}  // namespace tandem
