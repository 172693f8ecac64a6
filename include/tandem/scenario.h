// A scenario is one reference workload (seg, cls, mlp): it builds the models, the dataset, the
// loader and the stages of a mode, and records per-step losses. The CLI and the benchmark
// runner know scenarios only through this interface and the registry below.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/pipeline.h"
#include "tandem/trace.h"

namespace tandem {

struct ScenarioOptions {
  int64_t batch_size = 8;
  int workers = 8;        ///< loader worker threads
  /// Host batch slots in the loader's ring; 0: ring_slots_for(workers) (loader.h).
  int loader_depth = 0;
  uint64_t seed = 0;      ///< models, data and anything random derive from it
  c10::Device device = c10::Device(c10::kCPU);
  /// Priority of the training lane in pipelined modes (see LanePriority).
  LanePriority train_priority = LanePriority::kHigh;
  /// If set, the loader records its workers' fills and the consumer's waits here.
  Trace* trace = nullptr;
  /// 0: every batch of a run is full. 1..batch_size-1: the run's last batch has this many
  /// samples, as when a dataset's size is not a multiple of the batch size (seg and cls; a
  /// graphed mode runs that batch eagerly, since a graph's shapes are fixed).
  int64_t last_batch_size = 0;
};

class Scenario {
 public:
  virtual ~Scenario() = default;
  virtual std::string name() const = 0;
  /// The modes this scenario runs, the first being its serial baseline.
  virtual std::vector<std::string> modes() const = 0;
  /// A pipeline that trains `num_steps` steps in `mode` over a fresh loader of as many batches.
  /// Throws InvalidArgument for a mode not in modes().
  virtual std::unique_ptr<Pipeline> prepare(const std::string& mode, int64_t num_steps) = 0;
  /// The per-step training losses of the last prepared run, in step order (synchronizes).
  virtual std::vector<float> losses() const = 0;
  /// What the last run did that a reader should know (e.g. which parts were captured into CUDA
  /// graphs, what fell back to eager execution and why). Printed after the result.
  virtual std::vector<std::string> notes() const { return {}; }
};

/// Names of every registered scenario, for help texts and validation.
std::vector<std::string> scenario_names();
/// The modes of scenario `name` (the first is its serial baseline), without building it;
/// throws InvalidArgument for an unknown name.
std::vector<std::string> scenario_modes(const std::string& name);
/// The default batch size of scenario `name` on a GPU (`cuda`) or the CPU.
int64_t scenario_default_batch_size(const std::string& name, bool cuda);
/// The scenario called `name`; throws InvalidArgument naming it and the known ones.
std::unique_ptr<Scenario> make_scenario(const std::string& name, const ScenarioOptions& options);

/// Helpers every scenario's prepare() uses.
/// Throws InvalidArgument unless `mode` is one of `modes` and num_steps >= 0.
void check_prepare(const std::string& scenario, const std::vector<std::string>& modes,
                   const std::string& mode, int64_t num_steps);
/// The loader settings a scenario's options imply (batch size, workers, depth, seed, trace;
/// a short last batch is kept).
struct LoaderOptions;
LoaderOptions loader_options(const ScenarioOptions& options);
/// The samples in a run of `num_steps` batches: num_steps × batch_size, less what a short last
/// batch lacks. Throws InvalidArgument unless 0 <= last_batch_size < batch_size.
int64_t run_samples(const ScenarioOptions& options, int64_t num_steps);
/// The note a graphed mode leaves when it ran on the CPU, where there are no CUDA graphs.
std::string cpu_graph_note(const std::string& mode);
/// Mean cross-entropy of `logits` (B, C, ...) against int64 `labels` (B, ...): the value of
/// CrossEntropyLoss(), computed as per-element losses then a mean, which is deterministic on
/// CUDA (the fused mean reductions of nll_loss/nll_loss2d accumulate with atomics).
at::Tensor deterministic_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);
/// A (n,) float32 tensor of per-step losses on any device, as a host vector (synchronizes).
std::vector<float> losses_to_host(const at::Tensor& losses);

/// "a, b or c": for error messages that list what was expected.
std::string join_choices(const std::vector<std::string>& choices);

}  // namespace tandem
