// `tandem augment-bench`: the fused augmentation alone, on device-resident batches, beside a
// device-to-device copy of as many bytes measured in the same run (the bandwidth ceiling).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/augment.h"

namespace tandem {

struct AugmentBenchRow {
  std::string mode;       ///< "gpu" (the kernel) or "cpu" (the C++ reference, all cores)
  std::string sampling;   ///< the kernel's ("gather" or "staged"); "" on the CPU
  std::string requested;  ///< what --sampling asked for (auto, gather, staged); "" on CPU
  int64_t batch_size = 0;
  double ms_per_batch = 0;  ///< median over repeats
  double steps_per_s = 0;   ///< batches per second
  double images_per_s = 0;
  double gb_per_s = 0;       ///< (uint8 bytes read + float32 bytes written) / time
  double copy_gb_per_s = 0;  ///< a copy of the output's size: (read + written) / time; 0 on CPU
  /// The whole per-batch transform: drawing the parameters (one more launch) and augmenting.
  double ms_per_batch_with_draw = 0;
};

/// Times `augment` on random (B, 3, 256, 256) uint8 batches already on `device`, for each batch
/// size: warm-up, then `repeats` timings of 10 launches each (CUDA events), rotating among four
/// input batches so the L2 cache does not hold the input; the median per batch is reported. On a
/// GPU, one row per batch size and entry of `samplings` (the same inputs, one after another).
std::vector<AugmentBenchRow> run_augment_bench(const std::vector<int64_t>& batch_sizes,
                                               c10::Device device, int repeats,
                                               const AugmentSpec& spec = {},
                                               const std::vector<AugmentSampling>& samplings = {
                                                   AugmentSampling::kAuto});

std::string describe_augment_bench(const std::vector<AugmentBenchRow>& rows);
/// Rows in the committed results' shape: impl "tandem", scenario "augment", mode, batch_size,
/// steps_per_s, images_per_s, gb_per_s, copy_gb_per_s, ms_per_batch.
nlohmann::json augment_bench_json(const std::vector<AugmentBenchRow>& rows);

}  // namespace tandem
