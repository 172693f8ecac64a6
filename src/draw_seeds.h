// Where a per-sample parameter draw gets its randomness, for the draws of augment.cpp and
// resized_crop.cpp: on the CPU one 64-bit seed from a CPU generator; on a GPU the next Philox
// (seed, offset) of a CUDA generator, as a RngSource the draw kernel unpacks.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <mutex>

#include "kernels/rng_source.h"

namespace tandem {

/// The next seed of `generator` (a CPU generator, or undefined for the default one).
inline uint64_t next_host_seed(at::Generator generator) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->random64();
}

/// The next Philox state of `generator` (a CUDA generator of `device`, or undefined for its
/// default one). Each draw takes the next offset, eagerly or inside a capture (then the offset
/// is read from device memory at replay, and a registered generator advances it per replay).
inline RngSource next_device_rng(at::Generator generator, c10::Device device) {
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      generator, at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    state = gen->philox_cuda_state(4);
  }
  RngSource rng{};
  rng.captured = state.captured_;
  if (state.captured_) {
    rng.seed_ptr = state.seed_.ptr;
    rng.offset_ptr = state.offset_.ptr;
    rng.offset_intragraph = state.offset_intragraph_;
  } else {
    rng.seed = state.seed_.val;
    rng.offset = state.offset_.val;
  }
  return rng;
}

}  // namespace tandem
