// The one table of modes: names, descriptions and parsing.
#include "tandem/mode.h"

#include <iterator>

#include "tandem/error.h"

namespace tandem {

namespace {
struct ModeInfo {
  Mode mode;
  const char* name;
  const char* description;
};
// Simplest first: auto breaks near-ties towards the earlier mode.
constexpr ModeInfo kModeInfo[] = {
    {Mode::kSerial, "serial", "every stage of a step on one lane, step after step (the baseline)"},
    {Mode::kPipelined, "pipelined",
     "each stage on its own lane and thread: the feeds work on step n+1 while step n trains"},
    {Mode::kGraphed, "graphed",
     "one lane; everything after the load captured into one CUDA graph, replayed per step"},
    {Mode::kPipelinedGraphed, "pipelined+graphed",
     "pipelined's lanes; each GPU stage replays its own CUDA graph on its lane"},
    {Mode::kGraphedK, "graphed_k", "graphed, with K steps captured into one graph"},
};

const ModeInfo& info(Mode mode) {
  for (const auto& i : kModeInfo)
    if (i.mode == mode) return i;
  throw InvalidArgument("unknown mode value " + std::to_string(static_cast<int>(mode)));
}
}  // namespace

const char* to_string(Mode mode) { return info(mode).name; }
const char* describe(Mode mode) { return info(mode).description; }

const std::vector<Mode>& workload_modes() {
  static const std::vector<Mode> modes = [] {
    std::vector<Mode> out;
    for (const auto& i : kModeInfo) out.push_back(i.mode);
    return out;
  }();
  return modes;
}

std::string mode_choices() {
  std::vector<std::string> names;
  for (const auto& i : kModeInfo) names.push_back(i.name);
  return join_choices(names);
}

Mode parse_mode(const std::string& name) {
  for (const auto& i : kModeInfo)
    if (name == i.name) return i.mode;
  throw InvalidArgument("mode '" + name + "' is not valid: expected " + mode_choices());
}

bool runs_pipelined(Mode mode) {
  return mode == Mode::kPipelined || mode == Mode::kPipelinedGraphed;
}

bool captures_graphs(Mode mode) {
  return mode == Mode::kGraphed || mode == Mode::kPipelinedGraphed || mode == Mode::kGraphedK;
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
