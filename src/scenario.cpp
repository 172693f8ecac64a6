// The scenario registry: the one place that knows every workload by name.
#include "tandem/scenario.h"

#include "tandem/error.h"
#include "tandem/scenarios/cls.h"
#include "tandem/scenarios/seg.h"

namespace tandem {

std::vector<std::string> scenario_names() { return {"seg", "cls"}; }

namespace {
[[noreturn]] void unknown_scenario(const std::string& name) {
  throw InvalidArgument(detail::concat("scenario '", name, "' is not known: expected ",
                                       join_choices(scenario_names())));
}
}  // namespace

std::vector<std::string> scenario_modes(const std::string& name) {
  if (name == "seg") return SegScenario::kModes;
  if (name == "cls") return ClsScenario::kModes;
  unknown_scenario(name);
}

std::unique_ptr<Scenario> make_scenario(const std::string& name, const ScenarioOptions& options) {
  if (name == "seg") return std::make_unique<SegScenario>(options);
  if (name == "cls") return std::make_unique<ClsScenario>(options);
  unknown_scenario(name);
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) out += i + 1 == choices.size() ? " or " : ", ";
    out += choices[i];
  }
  return out;
}

}  // namespace tandem
