// copy_saved_state: see tandem/detail/saved_state.h.
#include "tandem/detail/saved_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

#include "tandem/error.h"

namespace tandem::detail {

void copy_saved_state(const std::string& who,
                      const std::vector<std::pair<std::string, at::Tensor>>& state,
                      const std::map<std::string, at::Tensor>& expected,
                      const std::function<bool(const std::string&)>& optional) {
  std::vector<std::string> problems;
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : state) {
    const auto it = expected.find(name);
    if (it == expected.end()) {
      problems.push_back("unexpected '" + name + "'");
      continue;
    }
    if (!t.defined() || t.sizes() != it->second.sizes()) {
      problems.push_back("'" + name + "' has shape " +
                         (t.defined() ? c10::str(t.sizes()) : std::string("undefined")) +
                         ", expected " + c10::str(it->second.sizes()));
      continue;
    }
    given[name] = &t;
  }
  for (const auto& [name, t] : expected)
    if (!given.count(name) && !optional(name) &&
        std::none_of(state.begin(), state.end(), [&](const auto& e) { return e.first == name; }))
      problems.push_back("missing '" + name + "'");
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    TANDEM_CHECK_ARG(false, who, ": the saved optimizer state does not fit: ", all);
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : given) expected.at(name).copy_(*t);
}

}  // namespace tandem::detail
