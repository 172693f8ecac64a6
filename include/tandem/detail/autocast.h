// Mixed precision for a stage's forward pass: bf16 or fp16 autocast on the stage's device type
// for a scope. Autocast state is thread-local, so each stage function enters it on its own thread
// (in the pipelined modes every stage has one); the weight-cast cache is off, because a captured
// graph must cast the weights it reads at every replay, not reuse a cast made before the
// optimizer updated them.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

#include <string>

#include "tandem/error.h"

namespace tandem {

/// kFp16 trains with a loss scale (tandem/loss_scale.h): fp16's range loses small gradients.
enum class Precision { kFp32, kBf16, kFp16 };

/// "fp32" | "bf16" | "fp16"; anything else is InvalidArgument naming it.
inline Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "fp16") return Precision::kFp16;
  TANDEM_CHECK_ARG(text == "bf16", "precision '", text,
                   "' is not valid: expected fp32, bf16 or fp16");
  return Precision::kBf16;
}
inline const char* to_string(Precision p) {
  return p == Precision::kBf16 ? "bf16" : p == Precision::kFp16 ? "fp16" : "fp32";
}
/// The dtype a convolution runs in under this precision (what autocast would cast it to): for
/// weights kept in it ahead of time, as a folded frozen backbone's are.
inline at::ScalarType compute_dtype(Precision p) {
  return p == Precision::kBf16 ? at::kBFloat16 : p == Precision::kFp16 ? at::kHalf : at::kFloat;
}
/// Whether training in this precision needs a loss scale (LossScale): fp16's.
inline bool needs_loss_scale(Precision p) { return p == Precision::kFp16; }

/// For its lifetime: ops on `device`'s type run under autocast to bf16 (kBf16) or fp16 (kFp16),
/// or as they are (kFp32: nothing changes). Restores the previous state on destruction.
class AutocastScope {
 public:
  AutocastScope(c10::Device device, Precision precision)
      : type_(device.type()), on_(precision != Precision::kFp32) {
    if (!on_) return;
    enabled_ = at::autocast::is_autocast_enabled(type_);
    dtype_ = at::autocast::get_autocast_dtype(type_);
    cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, compute_dtype(precision));
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastScope() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(type_, enabled_);
    at::autocast::set_autocast_dtype(type_, dtype_);
    at::autocast::set_autocast_cache_enabled(cache_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool on_;
  bool enabled_ = false, cache_ = true;
  at::ScalarType dtype_ = at::kBFloat16;
};

}  // namespace tandem
