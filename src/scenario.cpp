// The scenario registry: the one place that knows every workload by name.
#include "tandem/scenario.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/scenarios/cls.h"
#include "tandem/scenarios/mlp.h"
#include "tandem/scenarios/seg.h"

namespace tandem {

std::vector<std::string> scenario_names() { return {"seg", "cls", "mlp"}; }

namespace {
[[noreturn]] void unknown_scenario(const std::string& name) {
  throw InvalidArgument(detail::concat("scenario '", name, "' is not known: expected ",
                                       join_choices(scenario_names())));
}
}  // namespace

std::vector<std::string> scenario_modes(const std::string& name) {
  if (name == "seg") return SegScenario::kModes;
  if (name == "cls") return ClsScenario::kModes;
  if (name == "mlp") return MlpScenario::kModes;
  unknown_scenario(name);
}

std::unique_ptr<Scenario> make_scenario(const std::string& name, const ScenarioOptions& options) {
  if (name == "seg") return std::make_unique<SegScenario>(options);
  if (name == "cls") return std::make_unique<ClsScenario>(options);
  if (name == "mlp") return std::make_unique<MlpScenario>(options);
  unknown_scenario(name);
}

int64_t scenario_default_batch_size(const std::string& name, bool cuda) {
  scenario_modes(name);  // throws for an unknown name
  if (name == "mlp") return cuda ? 640 : 16;  // SPEC's (640, 4096) input
  if (name == "cls") return cuda ? 32 : 2;
  return cuda ? 8 : 2;
}

void check_prepare(const std::string& scenario, const std::vector<std::string>& modes,
                   const std::string& mode, int64_t num_steps) {
  TANDEM_CHECK_ARG(std::find(modes.begin(), modes.end(), mode) != modes.end(), "mode '", mode,
                   "' is not valid for scenario ", scenario, ": expected ", join_choices(modes));
  TANDEM_CHECK_ARG(num_steps >= 0, "step count ", num_steps, " is not valid: expected >= 0");
}

LoaderOptions loader_options(const ScenarioOptions& options) {
  LoaderOptions lo;
  lo.batch_size = options.batch_size;
  lo.workers = options.workers;
  lo.depth = options.loader_depth > 0 ? options.loader_depth : ring_slots_for(options.workers);
  lo.seed = options.seed;
  lo.trace = options.trace;
  lo.drop_last = false;  // run_samples() sizes the dataset: a short last batch is wanted
  return lo;
}

int64_t run_samples(const ScenarioOptions& options, int64_t num_steps) {
  const int64_t b = options.batch_size, last = options.last_batch_size;
  TANDEM_CHECK_ARG(last >= 0 && last < b, "last batch size ", last,
                   " is not valid: expected 0 (every batch full) or a size below the batch "
                   "size ", b);
  if (num_steps <= 0) return 0;
  return last == 0 ? num_steps * b : (num_steps - 1) * b + last;
}

std::string cpu_graph_note(const std::string& mode) {
  return "CUDA graphs need a CUDA device: mode " + mode + " ran eagerly on the CPU";
}

at::Tensor deterministic_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits, labels, {}, at::Reduction::None).mean();
}

std::vector<float> losses_to_host(const at::Tensor& losses) {
  const at::Tensor host = losses.to(at::kCPU).contiguous();  // synchronizes with the device
  return std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
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
