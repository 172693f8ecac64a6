// LossLog: per-step scalar losses appended on the device by one tiny kernel that reads and
// advances a device-side cursor, so recording a loss costs one launch and no host sync, and a
// record captured into a CUDA graph appends the next entry on every replay.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace tandem {

///   current stream:  ..[step n][append: log[c] = loss; c += 1][step n+1][append]..
///   (a replayed graph that captured K appends adds the next K entries: c is read on the device)
///
/// The cursor counts every record, those that found the log full included, so a reader sees
/// overflow (overflowed(), values() throws) instead of losing entries silently. One log is
/// appended to in stream order: records on different streams must be ordered by their callers
/// (events, Lane::wait_for), as every write to the same memory must.
class LossLog {
 public:
  /// An empty log of `capacity` >= 0 float32 entries on `device` (CUDA or CPU). On CUDA it is
  /// zeroed on the device's current stream: records on another stream must be ordered after it.
  LossLog(int64_t capacity, c10::Device device);

  /// Appends the value of `loss`, a one-element float32 tensor on the log's device. CUDA: one
  /// single-thread kernel on the device's current stream, after the work that produced `loss`;
  /// capture-safe. CPU: stores the value right away. Throws InvalidArgument naming the dtype,
  /// size or device of any other tensor.
  void record(const at::Tensor& loss);

  /// Empties the log for a new run (zeroes its cursor on the device's current stream, ordered
  /// as the constructor's zeroing is). Graphs that captured its records keep appending to it.
  void reset();

  int64_t capacity() const { return capacity_; }
  c10::Device device() const { return device_; }
  /// Every record so far, those that overflowed included (synchronizes the current stream).
  int64_t records() const;
  /// Records that found the log full and were not stored (synchronizes the current stream).
  int64_t overflowed() const;
  /// The stored entries in record order, min(records, capacity) of them: one device-to-host
  /// copy, which synchronizes the current stream. Throws c10::Error naming the counts if any
  /// record overflowed.
  std::vector<float> values() const;

 private:
  int64_t capacity_;
  c10::Device device_;
  // One allocation so that a read is one copy: bytes [0, 8) the cursor, then the entries.
  at::Tensor buffer_;  // (8 + 4 * capacity,) uint8
  at::Tensor cursor_;  // (1,) int64, a view of buffer_: records so far
  at::Tensor log_;     // (capacity,) float32, a view of buffer_
};

}  // namespace tandem
