// The launchers of the augmentation kernels: plain pointers and sizes, no LibTorch types, so
// augment.cu compiles without LibTorch's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "augment_draw.h"
#include "augment_math.h"
#include "rng_source.h"

namespace tandem {

constexpr int kAugmentMaxChannels = 4;
constexpr int kMaxPlaneTextures = 16;
constexpr int kGatherChannels = 3;

/// The batch (B, 3, H, W) uint8 seen as texture objects (unsigned 8-bit, read as normalized
/// floats, clamped at the edges, unnormalized coordinates) in groups of samples_per_texture
/// samples, as many as a texture's rows allow: group k's texture for channel c starts at that
/// channel's plane of the group's first sample and runs on through the group's later samples, so
/// sample s of the group, image row y, is texture row s * 3 * H + y in all three — one
/// coordinate pair for a pixel's three channels. count == 0: none; the kernel stages each tile's
/// source window instead.
struct PlaneTextures {
  int count = 0;  ///< groups
  int samples_per_texture = 0;
  cudaTextureObject_t handles[kMaxPlaneTextures][kGatherChannels] = {};
};

struct AugmentLaunch {
  const uint8_t* images;  // (B, C, in_h, in_w) uint8, device
  float* out;             // (B, C, out_h, out_w) float32, device
  int batch, channels;
  augment_math::Geometry geometry;
  const int32_t* top;    // (B,)
  const int32_t* left;   // (B,)
  const float* cos_a;    // (B,)
  const float* sin_a;    // (B,)
  const int32_t* flip;   // (B,)
  const float* weights;  // (B, taps)
  int taps;              // odd
  augment_math::Normalization normalization[kAugmentMaxChannels];
  PlaneTextures textures;  // count > 0: sample by texture gathers
  // The device starts a kernel before the previous one in the stream ends (compute capability
  // 9.0 and later): the launch lets it (programmatic dependent launch).
  bool programmatic_launch;
};

/// "" when the kernel has a texture-gather variant for these sizes (three channels, a blur size
/// compiled in: 1, 3, 5, 7 or 9), else why not; the others stage the source window.
std::string why_no_gathers(int channels, int taps);

/// One launch for the whole batch on `stream`; checks the launch. Capture-safe.
void launch_augment(const AugmentLaunch& args, cudaStream_t stream);

struct DrawLaunch {
  augment_math::DrawSpec spec;
  RngSource rng;
  int batch;
  int32_t *top, *left, *flip;                // (B,)
  float *angle_deg, *cos_a, *sin_a, *sigma;  // (B,)
  float* weights;                            // (B, taps)
};

/// Draws every sample's parameters in one launch on `stream`. Capture-safe.
void launch_draw(const DrawLaunch& args, cudaStream_t stream);

}  // namespace tandem
