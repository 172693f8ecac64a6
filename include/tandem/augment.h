// Per-sample image augmentation for workload "cls" (docs/reference-workloads.md): random crop ->
// resize -> random rotation -> Gaussian blur with a per-sample sigma -> normalize, as torchvision's
// pipeline does it, but with crop, resize and rotation composed into one sampling pass and the blur
// and normalize fused after it. One CUDA kernel augments a whole batch; a plain C++ twin computes
// the same function on the CPU (cpu_aug mode and the parity tests).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/workload.h"

namespace tandem {

/// What to do; the defaults are the cls workload's pipeline. Rotation is sampled nearest-neighbour
/// in the resized grid (torchvision's RandomRotation default, and the reference's), bilinear for
/// the resize; both paths (CPU, GPU) run the same arithmetic (src/kernels/augment_math.h).
struct AugmentSpec {
  int64_t crop_h = 128, crop_w = 128;       ///< random crop, inside the source image
  int64_t out_h = 256, out_w = 256;         ///< resize target (rotation keeps the size)
  double max_rotation_deg = 45.0;           ///< angle uniform in [-max, max]
  int64_t blur_kernel = 7;                  ///< odd, >= 1; 1 means no blur
  double sigma_min = 0.1, sigma_max = 2.0;  ///< blur sigma uniform in [min, max], per sample
  /// Per channel, in pixel units 0..255 (not torchvision's 0..1): out = (pixel - mean) / std,
  /// so ImageNet's mean 0.485 is 123.7 here and its std 0.229 is 58.4.
  std::vector<double> mean{0.0, 0.0, 0.0};
  std::vector<double> std{1.0, 1.0, 1.0};  ///< per channel, non-zero
  double hflip_probability = 0.0;          ///< mirror the output with this probability

  /// Throws InvalidArgument naming the first bad value for an image of `channels` x in_h x in_w.
  void validate(int64_t channels, int64_t in_h, int64_t in_w) const;
};

/// Per-sample parameters, one entry per sample (on the device that drew them):
struct AugmentParams {
  at::Tensor top, left;     ///< (B,) int32: crop offset
  at::Tensor angle_deg;     ///< (B,) float32: rotation, counter-clockwise
  at::Tensor cos_a, sin_a;  ///< (B,) float32: of the angle, computed once for both paths
  at::Tensor sigma;         ///< (B,) float32
  at::Tensor blur_weights;  ///< (B, blur_kernel) float32, each row sums to 1
  at::Tensor flip;          ///< (B,) int32, 0 or 1

  int64_t batch_size() const { return top.defined() ? top.size(0) : 0; }
  AugmentParams to(c10::Device device) const;
};

/// Draws the parameters of `batch_size` samples on `device` from `generator` (a generator of
/// that device, or undefined for the default one). On a GPU: one kernel launch for the batch,
/// keyed by the generator's seed and the next Philox offset (PyTorch's graph-safe bookkeeping):
/// reproducible for a seed, no host round trip, and capturable — register the generator with
/// the graph (GraphOptions::generators) and every replay draws fresh parameters, the same ones
/// the eager draws would have made. On the CPU: the same per-sample function, on the host.
AugmentParams draw_augment_params(const AugmentSpec& spec, int64_t batch_size, int64_t in_h,
                                  int64_t in_w, c10::Device device, at::Generator generator);

/// Draws one sample's parameters on the host from (seed, index), as a loader worker does in
/// cpu_aug mode: tensors of batch size 1 on the CPU.
AugmentParams draw_augment_params_host(const AugmentSpec& spec, int64_t in_h, int64_t in_w,
                                       uint64_t seed, int64_t index);

/// How the CUDA kernel reads the source image. Both ways compute the same values (to the bit).
enum class AugmentSampling {
  kAuto,           ///< texture gathers where the batch allows them, else the staged window
  kTextureGather,  ///< each bilinear read is three texture gathers (one per channel) of 2x2 bytes
  kStagedWindow,   ///< each tile stages its source window in shared memory, then reads it
};
const char* to_string(AugmentSampling sampling);
/// "auto", "gather" or "staged"; throws InvalidArgument naming the bad value otherwise.
AugmentSampling parse_augment_sampling(const std::string& name);

/// The sampling a CUDA launch on `images` takes for `requested`: kAuto resolves to
/// kTextureGather when the kernel has a gather variant for the spec (three channels, blur size
/// 1, 3, 5, 7 or 9) and the batch can be read as textures (see src/plane_textures.h: width a
/// multiple of the device's pitch alignment, aligned data), else to kStagedWindow. kTextureGather
/// throws InvalidArgument saying why it cannot.
AugmentSampling resolve_augment_sampling(const at::Tensor& images, const AugmentSpec& spec,
                                         AugmentSampling requested);

/// Augments `images` (B, C, H, W) uint8 with `params` (on the same device) into a new
/// (B, C, out_h, out_w) float32 tensor: one CUDA kernel on the current stream for CUDA inputs,
/// the C++ reference for CPU inputs (which ignore `sampling`).
at::Tensor augment(const at::Tensor& images, const AugmentParams& params, const AugmentSpec& spec,
                   AugmentSampling sampling = AugmentSampling::kAuto);

/// The C++ reference for one sample: `image` (C, H, W) uint8 contiguous CPU, parameters row
/// `row` of CPU `params`, written into `out` (C, out_h, out_w) float32 contiguous CPU.
void augment_sample_cpu(const at::Tensor& image, const AugmentParams& params, int64_t row,
                        const AugmentSpec& spec, at::Tensor& out);

/// The feed stage (lane "augment") that augments the batch field `field`, (B, C, H, W) uint8,
/// into (B, C, out_h, out_w) float32 under the same name: parameters drawn by
/// draw_augment_params from `generator` (registered with the stage, so a graph replay draws
/// what an eager step would), then augment(), which checks the batch against `spec`
/// (InvalidArgument naming what is wrong).
/// `generator`: seeded_generator(device, seed) for a reproducible run.
FeedStage augment_feed(const AugmentSpec& spec, at::Generator generator,
                       const std::string& field = "image");

}  // namespace tandem
