// Batches and the handoff of a batch between two lanes: event, wait, recordStream.
#include "handoff.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <stdexcept>

#include "tandem/error.h"

namespace tandem {

const at::Tensor& Batch::get(const std::string& name) const {
  for (const auto& [key, tensor] : tensors_)
    if (key == name) return tensor;
  std::string have;
  for (const auto& entry : tensors_) have += (have.empty() ? "" : ", ") + entry.first;
  throw std::out_of_range("batch " + std::to_string(index) + " has no tensor '" + name +
                          "' (it has: " + (have.empty() ? "nothing" : have) + ")");
}

bool Batch::has(const std::string& name) const {
  return std::any_of(tensors_.begin(), tensors_.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

void Batch::set(const std::string& name, at::Tensor tensor) {
  for (auto& entry : tensors_)
    if (entry.first == name) {
      entry.second = std::move(tensor);
      return;
    }
  tensors_.emplace_back(name, std::move(tensor));
}

void Batch::erase(const std::string& name) {
  tensors_.erase(std::remove_if(tensors_.begin(), tensors_.end(),
                                [&](const auto& entry) { return entry.first == name; }),
                 tensors_.end());
}

void Batch::clear() {
  tensors_.clear();
  index = -1;
  host_slot = -1;
}

void record_batch_on(const Batch& batch, const Lane& lane) {
  if (!lane.is_cuda()) return;
  for (const auto& entry : batch.tensors()) {
    const at::Tensor& t = entry.second;
    if (t.defined() && t.is_cuda() && t.has_storage() && t.storage().data_ptr().get())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), lane.stream());
  }
}

Handoff::Handoff(Lane producer, Lane consumer, int slots)
    : producer_(std::move(producer)),
      consumer_(std::move(consumer)),
      active_(producer_.is_cuda() && consumer_.is_cuda() && !producer_.same_stream(consumer_)) {
  TORCH_CHECK(slots > 0, "a handoff needs at least one slot, got ", slots);
  if (active_) ready_.resize(slots);
}

void Handoff::send(const Batch& batch, int slot) {
  if (active_) ready_.at(slot).record(producer_.stream());
}

void Handoff::receive(const Batch& batch, int slot) {
  if (!active_) return;
  ready_.at(slot).block(consumer_.stream());
  record_batch_on(batch, consumer_);
}

}  // namespace tandem
