// The reference workloads by name (seg, cls, mlp: docs/reference-workloads.md), for the CLI. Each
// is an instance of the workload API in one file; a user's workload needs no entry here — it is
// handed to the same run layer directly (tandem/run/run_workload.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tandem/workload.h"

namespace tandem {

/// seg, cls and mlp, in that order; then images where the data layer is built.
const std::vector<WorkloadEntry>& reference_workloads();
/// Their names, for help texts.
std::vector<std::string> reference_workload_names();
/// The reference workload called `name`; throws InvalidArgument naming it and the known ones.
const WorkloadEntry& find_reference_workload(const std::string& name);

}  // namespace tandem
