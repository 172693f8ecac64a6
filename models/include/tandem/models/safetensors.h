// safetensors in and out: the file format of Python's `safetensors.torch.save_file(
// model.state_dict(), path)`, so weights move between torchvision and tandem's models by name.
// The format is small (an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the bytes) and there is no C++ library for it among the
// project's dependencies, so it is read and written here with nlohmann-json.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::models {

/// Tensors by name, in file (or state_dict) order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Reads every tensor of a safetensors file into contiguous CPU tensors. Dtypes F64, F32, F16,
/// BF16, I64, I32, I16, I8, U8 and BOOL. Throws tandem::Error naming the file and the problem:
/// unreadable, shorter than its header says, a header that is not the format's JSON, an unknown
/// dtype, a byte range that does not match the shape or lies outside the data.
NamedTensors load_safetensors(const std::string& path);

/// Writes `tensors` (any device; copied to the CPU, made contiguous) as a safetensors file, with
/// optional string metadata ("__metadata__"). Atomic: written to path + ".tmp", flushed to disk,
/// then renamed over `path`, so a crash or a full disk never leaves a half-written file under
/// the name (the old file stays). Throws tandem::Error naming the path on any failure,
/// InvalidArgument for two tensors of one name or an unsupported dtype.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The module's parameters and buffers under their state_dict keys (state_dict_keys' order).
NamedTensors state_dict(const torch::nn::Module& module);

/// Copies `tensors` into the module's parameters and buffers by key (dtype converted, device
/// kept). Checks everything first and throws InvalidArgument listing every missing key (strict
/// only), unexpected key (strict only) and key whose shape differs, with both shapes; nothing is
/// copied then.
void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, bool strict = true);

}  // namespace tandem::models
