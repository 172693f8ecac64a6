// GraphedKStage: a stage whose device work is captured K times into one CUDA graph, so one
// replay advances K steps (mode graphed_k): the launch cost of a replay is paid once per K
// steps. Inputs are staged into K static slots, one per step of the graph.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph.h"
#include "graphed_stage.h"
#include "tandem/detail/lane.h"

namespace tandem {

/// Item by item, on the stage's lane and thread:
///
///   items 0..W-1:  work(inputs) eagerly on a side lane (warm-up: real steps)
///   item W:        statics[k] := (K, ...) slots shaped like the inputs; capture
///                  work(statics[0]) .. work(statics[K-1]) into one graph (records only)
///   each item:     copy its inputs into the next slot; when all K are staged, replay
///   the run's last item, or an item of other shapes (a short last batch):
///                  the staged slots run eagerly, in order, then (for another shape) the item
///
/// The work has no outputs: what it produces stays on the device (e.g. a LossLog record, which
/// appends K entries per replay in step order). On a CPU lane every item runs eagerly.
class GraphedKStage {
 public:
  using Work = GraphedStage::Work;
  /// `num_items`: the run's length, so the last item flushes what is staged.
  GraphedKStage(GraphOptions options, Work work, int steps_per_graph, int warmup_steps,
                int64_t num_items);
  ~GraphedKStage();
  GraphedKStage(const GraphedKStage&) = delete;
  GraphedKStage& operator=(const GraphedKStage&) = delete;

  void run(const Lane& lane, int64_t item, const std::vector<at::Tensor>& inputs);

  int steps_per_graph() const { return k_; }
  int warmup_steps() const { return warmup_; }
  bool captured() const { return graph_ && graph_->captured(); }
  /// Host seconds its capture took (GraphedStep::capture_seconds); 0 before one.
  double capture_seconds() const { return captured() ? graph_->capture_seconds() : 0; }
  int64_t replays() const { return replays_; }
  /// Steps after warm-up that ran eagerly (a final group shorter than K, another shape).
  std::vector<std::string> notes() const;

 private:
  void flush(const Lane& lane);  // runs the staged slots eagerly, in order

  GraphOptions options_;
  Work work_;
  int k_, warmup_;
  int64_t num_items_;
  std::unique_ptr<GraphedStep> graph_;
  std::vector<at::Tensor> statics_;  // per input: (K, ...input shape)
  int staged_ = 0;                   // slots filled since the last replay
  int64_t replays_ = 0, eager_steps_ = 0, other_shape_steps_ = 0;
  bool on_cpu_ = false;
};

}  // namespace tandem
