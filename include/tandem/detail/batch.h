// A batch as it travels through a pipeline: named tensors plus the bookkeeping a stage needs
// (which item it is, which loader slot its host memory came from).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

class Batch {
 public:
  /// The item number within the run (0, 1, ...); -1 when the slot is empty.
  int64_t index = -1;
  /// The loader's host slot this batch's data came from, -1 if none (see Loader::release).
  int host_slot = -1;
  /// The pipeline's ring slot holding this batch (0..depth()), -1 outside a pipeline. Buffers a
  /// stage keeps per ring slot are free for this item: the pipeline hands a slot to a new item
  /// only after the last stage of its previous item has finished on the device.
  int ring_slot = -1;

  /// The tensor called `name`; throws std::out_of_range naming it if absent.
  const at::Tensor& get(const std::string& name) const;
  bool has(const std::string& name) const;
  /// Adds or replaces the tensor called `name`.
  void set(const std::string& name, at::Tensor tensor);
  /// Drops the tensor called `name` (its memory returns to the allocator once every lane that
  /// used it is done: see Handoff).
  void erase(const std::string& name);
  /// Drops everything; keeps nothing alive.
  void clear();

  const std::vector<std::pair<std::string, at::Tensor>>& tensors() const { return tensors_; }

 private:
  // Few entries (2-4): a vector beats a map and keeps insertion order for printing.
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

}  // namespace tandem
