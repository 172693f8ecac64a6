// A saved state (a checkpoint's named tensors) checked against what an object expects and
// copied into it: the optimizers' and the loss scale's load_state.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::detail {

/// Checks `state` against the names and shapes `who` expects (`expected`: name -> the tensor it
/// goes into; `optional` names may be absent) and copies it in. Every problem is listed in one
/// InvalidArgument ("WHO: the saved optimizer state does not fit: ..."); nothing is copied
/// unless there is none.
void copy_saved_state(const std::string& who,
                      const std::vector<std::pair<std::string, at::Tensor>>& state,
                      const std::map<std::string, at::Tensor>& expected,
                      const std::function<bool(const std::string&)>& optional);

}  // namespace tandem::detail
