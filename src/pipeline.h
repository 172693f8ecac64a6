// A pipeline of K stages, each a function of a Batch running on its own lane. The same stage
// functions run in both modes, so serial mode is the baseline and the equivalence reference.
#pragma once

#include <ATen/cuda/CUDAEvent.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "handoff.h"
#include "tandem/detail/batch.h"
#include "tandem/detail/lane.h"
#include "tandem/detail/stage_timing.h"
#include "tandem/detail/trace.h"
#include "tandem/error.h"

namespace tandem {

enum class PipelineMode {
  kSerial,     ///< every stage of item n, in order, on one lane and one host thread
  kPipelined,  ///< each stage on its own lane, driven by its own host thread
};

const char* to_string(PipelineMode mode);

/// A stage failed while working on an item: what() is "stage 'train' (lane decoder) failed at
/// step 3: <cause>", the cause being the first line of the original exception's message
/// (LibTorch's without its backtrace). Pipeline::run throws it in both modes.
class StageError : public Error {
 public:
  StageError(std::string stage, std::string lane, int64_t item, std::string cause,
             std::exception_ptr original = nullptr);
  const std::string& stage() const { return details_->stage; }
  /// The lane the stage ran on in its mode (in serial mode, the pipeline's serial lane).
  const std::string& lane() const { return details_->lane; }
  int64_t item() const { return item_; }
  /// The first line of the original exception's message.
  const std::string& cause() const { return details_->cause; }
  /// The exception the stage threw, to inspect its type (nullptr if unknown).
  const std::exception_ptr& original() const { return details_->original; }

 private:
  // Shared, so that copying the exception (as throw and exception_ptr may) cannot throw.
  struct Details {
    std::string stage, lane, cause;
    std::exception_ptr original;
  };
  std::shared_ptr<const Details> details_;
  int64_t item_;
};

/// A stage: `fn` enqueues its work on the current stream (the pipeline sets it to `lane`) and
/// reads and writes the batch. It must not synchronize the host with the device.
struct Stage {
  std::string name;
  Lane lane;
  std::function<void(Batch&, const Lane&)> fn;
};

/// Runs items through stages. Lanes and events (pipelined mode, CUDA):
///
///   load lane:    [load 0][load 1][load 2]...                    (stage 0, host thread 0)
///                      └─ready─┐ └─ready─┐
///   encode lane:          [enc 0]     [enc 1]     ...            (stage 1, host thread 1)
///                               └─ready─┐  └─ready─┐
///   train lane:                      [train 0]   [train 1] ...   (stage K-1, host thread K-1)
///                                          └─done[slot]─► stage 0 waits before reusing the slot
///
/// In pipelined mode each stage is driven by its own host thread: enqueueing a training step
/// through LibTorch costs milliseconds of host time, and one thread enqueueing every stage in
/// turn would make the host, not the device, the bottleneck. Stage i takes items in order from
/// a queue fed by stage i-1 (device order through the Handoff's events, host order through the
/// queue). Batches live in a ring of `depth()+1` slots; a slot is reused for a new item only
/// after the last stage's "done" event of its previous item has completed (for a timed item, the
/// last stage's timing end event serves as that marker), which bounds how far the host runs
/// ahead and how much device memory batches in flight hold. Before the first item
/// every lane waits for the caller's current stream (so work enqueued there, e.g. model
/// initialization, is visible); at the end the caller's stream waits for every lane.
///
/// A stage's exception stops every stage thread: the failing thread calls the on_error hook,
/// closes every queue and opens the first-item gate, so that no thread waits for an item that
/// will never come; a thread waiting for a ring slot's done marker waits only for device work
/// already enqueued. run() then joins the threads and throws the first failure as StageError.
class Pipeline {
 public:
  /// In serial mode every stage runs on `serial_lane` (its Stage::lane is ignored).
  Pipeline(std::vector<Stage> stages, PipelineMode mode, Lane serial_lane);

  /// Called on the host, on the stage's thread, just before `stage` enqueues `item`.
  using ItemHook = std::function<void(int stage, int64_t item)>;

  /// Runs items 0..num_items-1 through every stage: fill, steady state, drain. Throws
  /// StageError naming the stage, its lane and the item when a stage function (or `on_item`,
  /// or the pipeline's own work for that stage) throws; a StageError is passed on unwrapped.
  void run(int64_t num_items, const ItemHook& on_item = {});

  /// Called once per failed run, on the failing stage's host thread, as soon as a stage fails:
  /// before the other stage threads are stopped and joined. Use it to wake what a stage
  /// function may be blocked on outside the pipeline's knowledge (e.g. WarmupBarrier::cancel),
  /// which would otherwise keep run() from returning. It must not throw (an exception from it is
  /// dropped: the stage's error is the one reported) and must not block.
  void set_on_error(std::function<void()> fn) { on_error_ = std::move(fn); }

  /// Items in flight from the first stage to the last: K when pipelined, 1 when serial. The
  /// ring holds depth() + 1 slots.
  int depth() const;
  int num_stages() const { return static_cast<int>(stages_.size()); }
  PipelineMode mode() const { return mode_; }
  const Stage& stage(int i) const { return stages_.at(i); }
  /// The lane stage i actually runs on in this mode.
  const Lane& lane_of(int i) const;

  /// Where the time went in the last run(), per stage, over the items from `first_timed_item`
  /// on (set_timing): stage_timing.h.
  using StageTimes = tandem::StageTimes;
  using Timing = StageTiming;
  /// Time items >= first_timed_item of later runs (a negative value turns timing off): host
  /// time for each, device time (a pair of CUDA events per stage) for every
  /// `device_timing_every`-th of them, or for each while a trace is recorded. Each event pair
  /// is work on the lane's stream between the stage's kernels; sampling keeps the measurement
  /// from adding to what it measures where a step is a fraction of a millisecond.
  void set_timing(int64_t first_timed_item, int64_t device_timing_every = 1) {
    TORCH_CHECK(device_timing_every >= 1,
                "device timing must sample one item in every n, n >= 1; got ", device_timing_every);
    first_timed_item_ = first_timed_item;
    device_timing_every_ = device_timing_every;
  }
  /// The timing of the last run (synchronizes with the timing events).
  Timing timing() const;
  /// Whether the timed item at `offset` (0 for the first timed item) is among those whose device
  /// time is sampled, one in every `every`: in each block of `every` consecutive items, the one
  /// at position (block number mod `every`). A fixed position would alias with work that repeats
  /// with a period sharing a factor with `every` — mlp's graphed_k replays its graph on every 4th
  /// item and only stages inputs on the others, and sampling every 4th item at a fixed position
  /// measured 0.03 ms of a 0.93 ms step; the rotating position samples every phase alike.
  static bool samples_device_time(int64_t offset, int64_t every) {
    const int64_t block = offset / every;
    return offset % every == block % every;
  }
  /// Pipelined mode: item 0 goes through the stages one at a time, each stage's work finished
  /// on the device before the next stage starts it, and no stage starts item 1 before the last
  /// has finished item 0 (on by default). Libraries that tune themselves on their first call —
  /// cuDNN's benchmark mode times candidate algorithms per host thread — then time them on an
  /// otherwise idle device, not against the other lanes' kernels, so one run's choices are the
  /// next run's: with tuning under the other lanes' load, seg's pipelined mode at batch 8 ran
  /// anywhere from 290 to 350 steps/s from one instance to the next
  /// (docs/notes/pipeline-and-graphs.md). The cost is one item's fill latency.
  void set_first_item_alone(bool alone) { first_item_alone_ = alone; }
  bool first_item_alone() const { return first_item_alone_; }
  /// Record the timed items of later runs into `trace` (nullptr: stop). Lane tracks get each
  /// stage's device interval (CUDA; aligned to host time through an origin event recorded on an
  /// idle device) or, on the CPU, its host interval; host tracks get each stage thread's enqueue
  /// intervals and its waits for ring slots.
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  void run_stage(int i, int slot);
  void begin_item(int64_t item, int slot);
  void end_item(int slot);
  // The exception `e` thrown for `stage` at `item`, as the StageError run() throws.
  std::exception_ptr stage_error(int stage, int64_t item, std::exception_ptr e) const;
  void call_on_error() const;
  // Device timing samples every this many timed items: every one while a trace is recorded.
  int64_t device_timing_stride() const { return trace_ ? 1 : device_timing_every_; }
  void run_serial(int64_t num_items, const ItemHook& on_item);
  void run_threaded(int64_t num_items, const ItemHook& on_item);

  std::vector<Stage> stages_;
  PipelineMode mode_;
  Lane serial_lane_;
  int slots_;
  std::vector<Batch> ring_;
  std::vector<Handoff> handoffs_;  // handoffs_[i]: stage i -> stage i+1
  // A slot's item is done on the device when its done marker has completed: the last stage's
  // timing end event for a timed item (recorded right after the stage on the same lane: a
  // second event there would only cost device time), else done_[slot] recorded by end_item.
  // A marker shares ownership of its event, so clearing stage_events_ never leaves it dangling.
  using EventPtr = std::shared_ptr<at::cuda::CUDAEvent>;
  std::vector<EventPtr> done_;         // per slot (CUDA), for untimed items
  std::vector<EventPtr> done_marker_;  // per slot; null: nothing to wait for
  std::function<void()> on_error_;

  // Timing (optional): per stage, host seconds and one (start, end) event pair per timed item.
  int64_t first_timed_item_ = -1;
  int64_t device_timing_every_ = 1;
  std::vector<double> host_seconds_;
  double slot_wait_seconds_ = 0;
  int64_t timed_items_ = 0;
  struct StageEvents {  // timing-enabled; `end` may also be its slot's done marker
    EventPtr start = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    EventPtr end = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    int64_t item = -1;
  };
  std::vector<std::vector<StageEvents>> stage_events_;
  bool first_item_alone_ = true;
  Trace* trace_ = nullptr;
  Trace::Clock::time_point origin_host_;
  std::optional<at::cuda::CUDAEvent> origin_event_;
  void emit_lane_spans();
  std::string host_track(int stage) const;
};

}  // namespace tandem
