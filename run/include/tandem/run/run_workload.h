// The run layer's one way to run a workload (tandem::run): build a fresh instance, run warm-up
// steps, then timed steps between two device synchronizations, and report — the reference
// workloads' timing method applied to any workload and mode, the reference ones
// (workloads/registry.h) or a user's, handed in as a WorkloadEntry. `tandem bench`, `tandem
// sweep`, mode auto's trials and tandem.Trainer (Python) all run through it.
#pragma once

#include "tandem/run/report.h"
#include "tandem/run/request.h"

namespace tandem::run {

/// Runs request.warmup + request.steps training steps and times the last request.steps.
/// Resolves the request first (resolve()); its mode must not be auto (resolve_mode.h).
RunReport run_workload(const RunRequest& request, const RunHooks& hooks = {});

}  // namespace tandem::run
