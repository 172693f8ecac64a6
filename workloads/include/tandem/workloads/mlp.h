// Workload "mlp" (docs/reference-workloads.md): Linear(4096->2048), Dropout(0.2),
// Linear(2048->1024), Dropout(0.1), MSE, SGD lr 0.1 on device-resident batches — a launch-bound
// step, the case for CUDA graphs (graphed, graphed_k). One train stage; no feeds, no loader.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "tandem/workload.h"

namespace tandem {

constexpr int64_t kMlpIn = 4096, kMlpHidden = 2048, kMlpOut = 1024;
constexpr double kMlpLearningRate = 0.1;
constexpr int kMlpDistinctBatches = 8;  ///< the run cycles through this many device batches

torch::nn::Sequential make_mlp_model();

struct MlpWorkload {
  Workload workload;
  torch::nn::Sequential model{nullptr};
};
/// The model and kMlpDistinctBatches random (batch_size, 4096) / (batch_size, 1024) batches,
/// seeded from options.seed, on options.device.
MlpWorkload make_mlp(const WorkloadOptions& options);
WorkloadEntry mlp_entry();

}  // namespace tandem
