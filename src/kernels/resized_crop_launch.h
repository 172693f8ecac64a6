// The launchers of the resized-crop kernels: plain pointers and sizes, no LibTorch types, so
// resized_crop.cu compiles without LibTorch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "resized_crop_math.h"
#include "rng_source.h"

namespace tandem {

constexpr int kCropMaxChannels = 4;

struct CropDrawLaunch {
  crop_math::DrawSpec spec;
  RngSource rng;
  int batch;
  const int64_t* sizes;  // (B, 3): H, W, C
  int32_t* boxes;        // (B, kBoxFields)
};

/// Draws every sample's box in one launch on `stream` (one thread a sample). Capture-safe.
void launch_crop_draw(const CropDrawLaunch& args, cudaStream_t stream);

struct CropLaunch {
  const uint8_t* packed;   // the samples back to back, each (H, W, C)
  const int64_t* offsets;  // (B,): where sample b starts in packed
  const int64_t* sizes;    // (B, 3)
  const int32_t* boxes;    // (B, kBoxFields)
  float* out;              // (B, C, out_h, out_w), or (B, out_h, out_w, C) in memory
  int batch, channels, out_h, out_w;
  bool planar;         // samples (C, H, W) instead of (H, W, C)
  bool channels_last;  // out laid out (B, out_h, out_w, C)
  crop_math::Normalization normalization[kCropMaxChannels];
};

/// One launch for the batch on `stream`: a thread per output pixel, all channels. A sample whose
/// channel count is not `channels` comes out as NaN (never read out of bounds). Capture-safe.
void launch_resized_crop(const CropLaunch& args, cudaStream_t stream);

}  // namespace tandem
