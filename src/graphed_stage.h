// GraphedStage: one pipeline stage whose device work is replayed as a CUDA graph on its lane
// (warm-up, capture, replay, eager fallback), and the WarmupBarrier that keeps the graphed
// stages of one pipeline from capturing while another still warms up.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph.h"
#include "tandem/detail/lane.h"
#include "tandem/mode.h"  // kGraphWarmupSteps

namespace tandem {

/// Shared by the graphed stages of one pipeline, which capture on different host threads: no
/// stage captures before every stage has finished its eager warm-up steps. Why: eager first
/// steps may autotune cuDNN convolutions — LibTorch keeps its cuDNN benchmark cache per thread,
/// so each stage thread autotunes its own convolutions on its first steps — and autotuning
/// synchronizes the device, which CUDA refuses while any thread captures on that device
/// ("operation not permitted when stream is capturing"; seg's pipelined+graphed failed so at
/// batch 32 and 128 on the H200 before this barrier). No deadlock in a pipeline: a stage waiting
/// here has already handed its warm-up items downstream, and upstream stages are past theirs.
class WarmupBarrier {
 public:
  void join();    ///< a stage that will warm up before it captures
  void arrive();  ///< that stage finished its warm-up (or will never finish it)
  /// Blocks until every joined stage has arrived; throws tandem::Error naming `stage` once the
  /// barrier is cancelled, or after 5 minutes.
  void wait(const std::string& stage);
  /// Another stage failed: wakes every waiter, and this and every later wait() throws at once.
  /// A failed stage may be one that never reaches its warm-up's end (an upstream stage failed
  /// first, so no more items come), so without this the others would wait the full timeout.
  /// Thread-safe, non-blocking; meant for Pipeline::set_on_error.
  void cancel();
  bool cancelled() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_;
  int pending_ = 0;
  bool cancelled_ = false;
};

/// What GraphedStage::run returns after a replay.
enum class GraphOutputs {
  kStatic,  ///< the graph's own outputs, rewritten by the stage's next replay: read them on the
            ///< stage's lane before the stage runs again (e.g. copy a loss out)
  kCloned,  ///< fresh copies made on the stage's lane after the replay: safe to hand to another
            ///< lane (a Handoff's recordStream then keeps them alive while it reads them)
};

/// One pipeline stage whose device work runs as replays of a CUDA graph, on the stage's lane and
/// thread. Item by item (the stage's calls, in order):
///
///   items 0..W-1:  work(inputs) eagerly on a side lane — real steps, their results count
///   item W:        statics := empty_like(inputs); copy inputs in; capture work(statics); replay
///   later items:   copy inputs into the statics on the lane; replay
///   any later item whose inputs' shapes differ from the captured ones (a short last batch):
///                  work(inputs) eagerly on the lane, and notes() says so
///
/// On a CPU lane every item runs work(inputs) eagerly (there is nothing to capture). The copy
/// into the statics is ordered after the previous replay by the lane's stream, so one set of
/// statics suffices. Capture-safety rules are GraphedStep's. In a pipeline whose stages capture
/// on their own threads, no two stages (nor their warm-up lanes) may share a stream: work that
/// one thread enqueues on a stream another thread is capturing on would join — or break — that
/// capture. LibTorch's pool hands out 32 streams per priority round-robin, so the few lanes a
/// pipeline creates together are distinct.
class GraphedStage {
 public:
  /// The stage's device work: reads `inputs`, returns its outputs (the same number each call).
  using Work = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

  /// `barrier`: the pipeline's, when several graphed stages capture on their own threads.
  GraphedStage(GraphOptions options, Work work, GraphOutputs outputs = GraphOutputs::kStatic,
               std::shared_ptr<WarmupBarrier> barrier = nullptr,
               int warmup_steps = kGraphWarmupSteps);
  ~GraphedStage();
  GraphedStage(const GraphedStage&) = delete;
  GraphedStage& operator=(const GraphedStage&) = delete;

  /// Runs item `item` (for notes) of the stage on `lane`, as the table above says, and returns
  /// the outputs: work's own after an eager step, else as GraphOutputs says.
  std::vector<at::Tensor> run(const Lane& lane, int64_t item,
                              const std::vector<at::Tensor>& inputs);

  /// A new run of the pipeline the stage is kept in: its items count from 0 again and its notes
  /// and capture_seconds() are the new run's. A captured graph stays and replays at once.
  void begin_run();

  const std::string& name() const { return options_.name; }
  int warmup_steps() const { return warmup_; }
  bool captured() const { return graph_ && graph_->captured(); }
  /// Whether its graph was captured in an earlier run (begin_run) and replays in this one.
  bool kept() const { return kept_; }
  /// Host seconds its capture took in this run (GraphedStep::capture_seconds); 0 before one,
  /// and in a run that replays a graph kept from an earlier one.
  double capture_seconds() const { return captured() && !kept_ ? graph_->capture_seconds() : 0; }
  int64_t replays() const { return replays_; }
  int64_t run_replays() const { return run_replays_; }  ///< this run's (begin_run)
  /// Items after warm-up that ran eagerly because their shapes differed from the captured ones.
  const std::vector<int64_t>& eager_items() const { return eager_items_; }
  /// What a reader should know besides the capture itself: items that ran eagerly and why.
  std::vector<std::string> notes() const;

 private:
  void release_barrier();  // arrives at barrier_ once: warm-up done, failed, or stage gone

  GraphOptions options_;
  Work work_;
  GraphOutputs outputs_;
  int warmup_;
  std::optional<Lane> side_;            // the warm-up lane
  std::unique_ptr<GraphedStep> graph_;  // made at capture, when the statics exist
  std::vector<at::Tensor> static_inputs_, static_outputs_;
  int64_t calls_ = 0, replays_ = 0;
  int64_t run_calls_ = 0, run_replays_ = 0;  // this run's (begin_run)
  bool kept_ = false;                        // captured before this run
  bool on_cpu_ = false;
  std::shared_ptr<WarmupBarrier> barrier_;
  bool barrier_pending_ = false;  // joined barrier_ and not yet arrived
  std::vector<int64_t> eager_items_;
  std::string eager_reason_;  // the first mismatch: "input 0 is [3, ...], captured [8, ...]"
};

}  // namespace tandem
