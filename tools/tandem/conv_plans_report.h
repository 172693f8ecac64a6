// The process's convolution plans as a run's report gives them (its JSON, its table's line):
// what cuDNN's tuning cost the run and what the plans file saved it, beside its other setup
// seconds.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

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

/// The table's line, e.g. "plans      46 convolution plans timed in 0.85 s, 0 from the plans
/// file"; empty where no convolution took a plan.
inline std::string conv_plans_line(const models::ConvPlansSummary& s) {
  if (s.tuned + s.from_file == 0) return "";
  char line[160];
  std::snprintf(line, sizeof line,
                "plans      %lld convolution plans timed in %.2f s, %lld from the plans file in "
                "%.2f s\n",
                static_cast<long long>(s.tuned), s.tuning_seconds,
                static_cast<long long>(s.from_file), s.rebuilding_seconds);
  return line;
}

}  // namespace tandem::cli
