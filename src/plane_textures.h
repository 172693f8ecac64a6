// Texture objects over a batch of uint8 images, for the augment kernel's texture gathers: a
// process-wide cache, so that a texture is created once per image buffer and outlives any CUDA
// graph that captured a launch using it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/augment_launch.h"

namespace tandem {

/// Fills `out` with textures over `images`, a (batch, 3, height, width) uint8 contiguous batch on
/// the current CUDA device (PlaneTextures: three per group of samples), and returns ""; or
/// returns why it cannot (not 3 channels, a width the device's texture pitch alignment does not
/// divide, a base address or a channel plane's size off the texture alignment, a sample taller
/// than a texture, more textures than a launch takes, the cache full), leaving
/// `out` empty. Safe during a graph capture (a new texture is made outside the capture's
/// bookkeeping) and from several threads.
/// `device_properties`: that device's (its texture limits).
std::string plane_textures(const cudaDeviceProp& device_properties, const uint8_t* images,
                           int64_t batch, int64_t channels, int64_t height, int64_t width,
                           PlaneTextures& out);

}  // namespace tandem
