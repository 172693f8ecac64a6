// Helpers shared by the test files: CUDA presence, deterministic settings.
#pragma once

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

namespace tandem::testing {

inline bool have_cuda() { return c10::cuda::device_count() > 0; }

/// Deterministic algorithms and no cuDNN autotuning: the same inputs give the same bits.
inline void use_deterministic_algorithms() {
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace tandem::testing

#define TANDEM_SKIP_WITHOUT_CUDA() \
  if (!::tandem::testing::have_cuda()) GTEST_SKIP() << "no CUDA device on this machine"
