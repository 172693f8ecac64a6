// GraphedKStage: K steps per CUDA graph, with inputs staged into K static slots.
#include "graphed_k_stage.h"

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem {

GraphedKStage::GraphedKStage(GraphOptions options, Work work, int steps_per_graph, int warmup_steps,
                             int64_t num_items)
    : options_(std::move(options)),
      work_(std::move(work)),
      k_(steps_per_graph),
      warmup_(warmup_steps),
      num_items_(num_items) {
  TANDEM_CHECK_ARG(k_ >= 1, "steps per graph ", k_, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(warmup_ >= 0, "warm-up step count ", warmup_, " is not valid: expected >= 0");
  TORCH_CHECK(work_, "stage '", options_.name, "' has no work");
}

GraphedKStage::~GraphedKStage() = default;

void GraphedKStage::flush(const Lane& lane) {
  for (int s = 0; s < staged_; ++s) {
    std::vector<at::Tensor> slot;
    for (const at::Tensor& t : statics_) slot.push_back(t[s]);
    work_(slot);
    ++eager_steps_;
  }
  staged_ = 0;
}

void GraphedKStage::run(const Lane& lane, int64_t item, const std::vector<at::Tensor>& inputs) {
  if (!lane.is_cuda()) {
    on_cpu_ = true;
    work_(inputs);
    return;
  }
  if (item < warmup_) {
    warm_up_on_side_lane(lane, 1, [&](int) { work_(inputs); });
    return;
  }
  LaneGuard guard(lane, "graph inputs");
  if (!graph_) {
    // The slots take the first graphed item's shapes and dtypes; the capture records K steps
    // over them and runs nothing.
    for (const at::Tensor& t : inputs) {
      std::vector<int64_t> shape{k_};
      shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
      statics_.push_back(at::empty(shape, t.options()));
    }
    GraphOptions o = options_;
    o.static_tensors.insert(o.static_tensors.end(), statics_.begin(), statics_.end());
    graph_ = std::make_unique<GraphedStep>(std::move(o));
    graph_->capture(lane, [&] {
      for (int s = 0; s < k_; ++s) {
        std::vector<at::Tensor> slot;
        for (const at::Tensor& t : statics_) slot.push_back(t[s]);
        work_(slot);
      }
    });
  }
  bool same = inputs.size() == statics_.size();
  for (size_t i = 0; same && i < inputs.size(); ++i)
    same = inputs[i].sizes().equals(statics_[i].sizes().slice(1));
  if (!same) {  // steps keep their order: what is staged runs first
    flush(lane);
    work_(inputs);
    ++other_shape_steps_;
    return;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor slot = statics_[i][staged_];
    copy_into_static(slot, inputs[i]);
  }
  if (++staged_ == k_) {
    graph_->replay(lane);
    ++replays_;
    staged_ = 0;
  } else if (item + 1 == num_items_) {
    flush(lane);
  }
}

std::vector<std::string> GraphedKStage::notes() const {
  std::vector<std::string> out;
  if (on_cpu_) return out;
  if (!captured() && num_items_ > 0 && num_items_ <= warmup_)
    out.push_back(detail::concat(options_.name, ": all ", num_items_,
                                 " step(s) ran eagerly: a graph is captured only after ", warmup_,
                                 " warm-up steps"));
  if (eager_steps_ > 0)
    out.push_back(detail::concat("the last ", eager_steps_, " step(s) ran eagerly: fewer than ", k_,
                                 " were left for a replay"));
  if (other_shape_steps_ > 0)
    out.push_back(detail::concat(other_shape_steps_,
                                 " step(s) ran eagerly: their shapes differ from the captured "
                                 "ones (a short last batch)"));
  return out;
}

}  // namespace tandem
