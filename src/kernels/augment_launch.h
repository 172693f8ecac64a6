// The launcher of the fused augmentation kernel: plain pointers and sizes, no LibTorch types,
// so augment.cu compiles without LibTorch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "augment_math.h"

namespace tandem {

constexpr int kAugmentMaxChannels = 4;

struct AugmentLaunch {
  const uint8_t* images;  // (B, C, in_h, in_w) uint8, device
  float* out;             // (B, C, out_h, out_w) float32, device
  int batch, channels;
  augment_math::Geometry geometry;
  const int32_t* top;     // (B,)
  const int32_t* left;    // (B,)
  const float* cos_a;     // (B,)
  const float* sin_a;     // (B,)
  const int32_t* flip;    // (B,)
  const float* weights;   // (B, taps)
  int taps;               // odd
  float mean[kAugmentMaxChannels];
  float std[kAugmentMaxChannels];
};

/// One launch for the whole batch on `stream`; checks the launch. Capture-safe.
void launch_augment(const AugmentLaunch& args, cudaStream_t stream);

}  // namespace tandem
