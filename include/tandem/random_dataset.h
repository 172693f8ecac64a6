// RandomDataset: synthetic samples of any shape — uniform random numbers per field — for running
// and timing a workload before its real data exists, or in tests. Sample i is a pure function
// of (seed, i) (SampleRng), so every worker and every run makes the same bytes for it.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/loader.h"

namespace tandem {

/// One field of a random sample: values uniform in [low, high).
struct RandomField {
  std::string name;
  std::vector<int64_t> shape;
  /// uint8, int32, int64 (integers in [low, high), high - low at most 2^32) or float32.
  at::ScalarType dtype = at::kByte;
  double low = 0, high = 256;
};

class RandomDataset : public Dataset {
 public:
  /// Throws InvalidArgument naming the first bad field: no name, a repeated name, a negative
  /// dimension, another dtype, high <= low, or an integer range wider than 2^32 or outside the
  /// dtype's values.
  RandomDataset(std::vector<RandomField> fields, int64_t size, uint64_t seed);
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override;
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;

 private:
  std::vector<RandomField> fields_;
  int64_t size_;
  uint64_t seed_;
};

}  // namespace tandem
