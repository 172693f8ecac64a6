// The process's convolution plans as a report's JSON gives them: what cuDNN's tuning cost a run
// and what the plans file saved it, beside the run's other setup seconds.
#pragma once

#include <nlohmann/json.hpp>

#include "tandem/models/tuned_conv.h"

namespace tandem::cli {

/// {"tuned", "tuning_s", "from_file", "prebuilt", "rebuilding_s", "untimed", "refused",
/// "runtime_compiled"} of the process's plans so far; null where no convolution took a plan.
inline nlohmann::json conv_plans_json(const models::ConvPlansSummary& s) {
  if (s.tuned + s.from_file + s.untimed + s.refused == 0) return nullptr;
  return {
      {"tuned", s.tuned},       {"tuning_s", s.tuning_seconds},          {"from_file", s.from_file},
      {"prebuilt", s.prebuilt}, {"rebuilding_s", s.rebuilding_seconds},  {"untimed", s.untimed},
      {"refused", s.refused},   {"runtime_compiled", s.runtime_compiled}};
}

}  // namespace tandem::cli
