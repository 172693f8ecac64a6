// The pipeline's tick loop: fill, steady state and drain over a ring of batch slots.
#include "pipeline.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <mutex>

#include "tandem/detail/kept_threads.h"

namespace tandem {

const char* to_string(PipelineMode mode) {
  return mode == PipelineMode::kSerial ? "serial" : "pipelined";
}

StageError::StageError(std::string stage, std::string lane, int64_t item, std::string cause,
                       std::exception_ptr original)
    : Error(detail::concat("stage '", stage, "' (lane ", lane, ") failed at step ", item, ": ",
                           cause)),
      details_(std::make_shared<const Details>(
          Details{std::move(stage), std::move(lane), std::move(cause), std::move(original)})),
      item_(item) {}

Pipeline::Pipeline(std::vector<Stage> stages, PipelineMode mode, Lane serial_lane)
    : stages_(std::move(stages)), mode_(mode), serial_lane_(std::move(serial_lane)) {
  TORCH_CHECK(!stages_.empty(), "a pipeline needs at least one stage");
  for (const auto& s : stages_) {
    TORCH_CHECK(s.fn, "stage '", s.name, "' has no function");
    TORCH_CHECK(s.lane.device() == serial_lane_.device(), "stage '", s.name, "' runs on ",
                s.lane.device(), " but the pipeline runs on ", serial_lane_.device());
  }
  slots_ = depth() + 1;
  ring_.resize(slots_);
  for (int i = 0; i + 1 < num_stages(); ++i)
    handoffs_.emplace_back(lane_of(i), lane_of(i + 1), slots_);
  if (serial_lane_.is_cuda())
    for (int slot = 0; slot < slots_; ++slot)
      done_.push_back(std::make_shared<at::cuda::CUDAEvent>());
  done_marker_.assign(slots_, nullptr);
}

int Pipeline::depth() const { return mode_ == PipelineMode::kPipelined ? num_stages() : 1; }

const Lane& Pipeline::lane_of(int i) const {
  return mode_ == PipelineMode::kSerial ? serial_lane_ : stages_.at(i).lane;
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

std::string Pipeline::host_track(int stage) const {
  return mode_ == PipelineMode::kSerial ? "host: serial" : "host: " + stages_[stage].name;
}

void Pipeline::run_stage(int i, int slot) {
  const Lane& lane = lane_of(i);
  const int64_t item = ring_[slot].index;
  const bool timed = first_timed_item_ >= 0 && item >= first_timed_item_;
  LaneGuard guard(lane, stages_[i].name.c_str());
  if (!timed) {
    stages_[i].fn(ring_[slot], lane);
    return;
  }
  const auto start = Clock::now();
  const bool device_timed =
      lane.is_cuda() && samples_device_time(item - first_timed_item_, device_timing_stride());
  if (device_timed) {
    stage_events_[i].emplace_back();  // a timing-enabled start/end pair
    stage_events_[i].back().item = item;
    stage_events_[i].back().start->record(lane.stream());
  }
  stages_[i].fn(ring_[slot], lane);
  if (device_timed) stage_events_[i].back().end->record(lane.stream());
  const auto end = Clock::now();
  host_seconds_[i] += std::chrono::duration<double>(end - start).count();
  if (trace_) {
    const double us = std::chrono::duration<double, std::micro>(end - start).count();
    trace_->add({TraceSpan::Kind::kHost, host_track(i), stages_[i].name,
                 trace_->us_since_origin(start), us, item});
    // On the CPU the lane is the thread and the work runs inside the call: the same interval.
    if (!lane.is_cuda())
      trace_->add({TraceSpan::Kind::kLane, lane.name(), stages_[i].name,
                   trace_->us_since_origin(start), us, item});
  }
}

void Pipeline::emit_lane_spans() {
  if (!trace_ || !origin_event_) return;
  const double origin_us = trace_->us_since_origin(origin_host_);
  for (int i = 0; i < num_stages(); ++i)
    for (auto& e : stage_events_[i]) {
      e.end->synchronize();
      const double start_us = origin_us + 1e3 * origin_event_->elapsed_time(*e.start);
      trace_->add({TraceSpan::Kind::kLane, lane_of(i).name(), stages_[i].name, start_us,
                   1e3 * e.start->elapsed_time(*e.end), e.item});
    }
}

Pipeline::Timing Pipeline::timing() const {
  Timing t;
  t.items = timed_items_;
  const double n = timed_items_ > 0 ? static_cast<double>(timed_items_) : 1.0;
  t.slot_wait_ms_per_item = 1e3 * slot_wait_seconds_ / n;
  t.device_timing_every = device_timing_stride();
  for (int i = 0; i < num_stages(); ++i) {
    StageTimes st;
    st.name = stages_[i].name;
    st.lane = lane_of(i).name();
    st.host_ms_per_item = 1e3 * host_seconds_[i] / n;
    if (lane_of(i).is_cuda()) {
      double ms = 0;
      for (const auto& e : stage_events_[i]) {
        e.end->synchronize();  // run() returns once the caller's stream waits, not the host
        ms += e.start->elapsed_time(*e.end);
      }
      st.device_ms_per_item = stage_events_[i].empty()
                                  ? std::numeric_limits<double>::quiet_NaN()
                                  : ms / static_cast<double>(stage_events_[i].size());
    } else {
      st.device_ms_per_item = std::numeric_limits<double>::quiet_NaN();
    }
    t.stages.push_back(st);
  }
  return t;
}

void Pipeline::begin_item(int64_t item, int slot) {
  // A slot is handed to a new item only after the last stage of its previous item finished on
  // the device: this bounds host run-ahead and the memory of batches in flight.
  // Device work already enqueued is all it waits for, so it returns even after another stage
  // failed.
  if (done_marker_[slot]) {
    const auto start = Clock::now();
    TANDEM_CUDA_CHECK(cudaEventSynchronize(done_marker_[slot]->event()));
    if (first_timed_item_ >= 0 && item >= first_timed_item_) {
      const double waited = seconds_since(start);
      slot_wait_seconds_ += waited;
      if (trace_)
        trace_->add({TraceSpan::Kind::kHost, host_track(0), "slot wait",
                     trace_->us_since_origin(start), 1e6 * waited, item});
    }
  }
  ring_[slot].clear();
  ring_[slot].index = item;
  ring_[slot].ring_slot = slot;
}

void Pipeline::end_item(int slot) {
  if (!done_.empty()) {
    // run_stage() of the last stage, on this thread, just recorded the timing events of a timed
    // item: its end event marks the slot, and outlives stage_events_ for as long as it does.
    const auto& timed = stage_events_[num_stages() - 1];
    if (!timed.empty() && timed.back().item == ring_[slot].index) {
      done_marker_[slot] = timed.back().end;
    } else {
      // Re-recording done_[slot] is safe: nothing waits for its last record any more (begin_item
      // of this item waited for the slot's marker, at or after that record on this lane).
      done_[slot]->record(lane_of(num_stages() - 1).stream());
      done_marker_[slot] = done_[slot];
    }
  }
  // Dropping the tensors now returns their memory to the allocator, which will not reuse it
  // before every lane that recorded a use of it (Handoff::receive) has passed that point.
  const int64_t index = ring_[slot].index;
  ring_[slot].clear();
  ring_[slot].index = index;
}

void Pipeline::run(int64_t num_items, const ItemHook& on_item) {
  TORCH_CHECK(num_items >= 0, "a pipeline cannot run a negative number of items: ", num_items);
  const Lane caller = Lane::current("caller", serial_lane_.device());
  host_seconds_.assign(num_stages(), 0.0);
  stage_events_.clear();  // a done marker among them stays alive in done_marker_
  stage_events_.resize(num_stages());
  slot_wait_seconds_ = 0;
  timed_items_ = first_timed_item_ >= 0 ? std::max<int64_t>(0, num_items - first_timed_item_) : 0;
  for (int i = 0; i < num_stages(); ++i) lane_of(i).wait_for(caller);
  origin_event_.reset();
  if (trace_ && caller.is_cuda()) {
    // An idle device processes the origin event as soon as it is recorded, so its timestamp
    // and the host clock read here name the same instant (to a few microseconds).
    caller.synchronize();
    for (int i = 0; i < num_stages(); ++i) lane_of(i).synchronize();
    origin_event_.emplace(cudaEventDefault);
    origin_host_ = Clock::now();
    origin_event_->record(caller.stream());
  }
  if (mode_ == PipelineMode::kSerial) {
    // On the train role's kept thread (kept_threads.h: what it tuned on the last run stays).
    detail::start_on_kept_thread(detail::stage_role(stages_.back().name, true), "serial", [&] {
      run_serial(num_items, on_item);
    }).get();
  } else {
    run_threaded(num_items, on_item);
  }
  for (int i = 0; i < num_stages(); ++i) caller.wait_for(lane_of(i));
  emit_lane_spans();
}

std::exception_ptr Pipeline::stage_error(int stage, int64_t item, std::exception_ptr e) const {
  std::string cause;
  try {
    std::rethrow_exception(e);
  } catch (const StageError&) {
    return e;  // a nested pipeline's stage: already says where it failed
  } catch (const c10::Error& x) {
    cause = x.what_without_backtrace();
  } catch (const std::exception& x) {
    cause = x.what();
  } catch (...) {
    cause = "an exception that is not a std::exception";
  }
  return std::make_exception_ptr(
      StageError(stages_[stage].name, lane_of(stage).name(), item, first_line(cause), e));
}

void Pipeline::call_on_error() const {
  if (!on_error_) return;
  try {
    on_error_();
  } catch (...) {
    // Dropped: the stage's own error is the one run() reports.
  }
}

void Pipeline::run_serial(int64_t num_items, const ItemHook& on_item) {
  for (int64_t item = 0; item < num_items; ++item) {
    const int slot = static_cast<int>(item % slots_);
    // The stage a failure is reported for: the slot wait counts as the first stage's work, the
    // done marker as the last's.
    int stage = 0;
    try {
      begin_item(item, slot);
      for (; stage < num_stages(); ++stage) {
        if (on_item) on_item(stage, item);
        run_stage(stage, slot);
      }
      stage = num_stages() - 1;
      end_item(slot);
    } catch (...) {
      const std::exception_ptr error = stage_error(stage, item, std::current_exception());
      call_on_error();
      std::rethrow_exception(error);
    }
  }
}

namespace {
// A blocking queue of ring slots between two stage threads; close() wakes every waiter.
class SlotQueue {
 public:
  void push(int slot) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_.push_back(slot);
    }
    cv_.notify_one();
  }
  /// The next slot, or -1 once closed.
  int pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return closed_ || !slots_.empty(); });
    if (closed_) return -1;
    const int slot = slots_.front();
    slots_.pop_front();
    return slot;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<int> slots_;
  bool closed_ = false;
};
}  // namespace

void Pipeline::run_threaded(int64_t num_items, const ItemHook& on_item) {
  const int K = num_stages();
  // inbox[0] holds free slots; inbox[i] the slots stage i-1 has finished with.
  std::vector<SlotQueue> inbox(K);
  for (int s = 0; s < slots_; ++s) inbox[0].push(s);
  std::mutex error_mutex;
  std::exception_ptr error;  // the first failure, as a StageError
  // Opened when the last stage has finished item 0 on the device (set_first_item_alone), or
  // when a stage failed, so that no thread waits for an item that will never finish.
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool gate_open = !first_item_alone_ || num_items == 0;
  auto open_gate = [&] {
    {
      std::lock_guard<std::mutex> lock(gate_mutex);
      gate_open = true;
    }
    gate_cv.notify_all();
  };

  auto stage_loop = [&](int i) {
    int64_t item = 0;
    try {
      for (; item < num_items; ++item) {
        const int slot = inbox[i].pop();
        if (slot < 0) return;  // another stage failed
        if (i == 0) {
          begin_item(item, slot);
        } else {
          TORCH_INTERNAL_ASSERT(ring_[slot].index == item, "stage ", stages_[i].name,
                                " expected item ", item, " but got ", ring_[slot].index);
          handoffs_[i - 1].receive(ring_[slot], slot);
        }
        if (on_item) on_item(i, item);
        run_stage(i, slot);
        const bool alone = first_item_alone_ && item == 0;
        if (alone) lane_of(i).synchronize();  // finished on the device before the next stage
        if (i + 1 < K) {
          handoffs_[i].send(ring_[slot], slot);
          inbox[i + 1].push(slot);
        } else {
          end_item(slot);
          inbox[0].push(slot);
        }
        if (alone) {
          if (i + 1 == K) {
            open_gate();
          } else {
            std::unique_lock<std::mutex> lock(gate_mutex);
            gate_cv.wait(lock, [&] { return gate_open; });
          }
        }
      }
    } catch (...) {
      std::exception_ptr e = stage_error(i, item, std::current_exception());
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) {
          error = std::move(e);
          first = true;
        }
      }
      // Recorded first, so that a stage that on_error wakes into failing reports second.
      if (first) call_on_error();
      for (auto& q : inbox) q.close();
      open_gate();
    }
  };

  // Each stage on its role's kept thread (kept_threads.h): what a stage's thread tuned on its
  // first steps (cuDNN's plans) serves the next run's stage of that role.
  std::vector<std::future<void>> stages;
  try {
    for (int i = 0; i < K; ++i)
      stages.push_back(detail::start_on_kept_thread(detail::stage_role(stages_[i].name, i + 1 == K),
                                                    stages_[i].name,
                                                    [&stage_loop, i] { stage_loop(i); }));
  } catch (...) {  // no thread for a stage (std::system_error): stop those already started
    for (auto& q : inbox) q.close();
    open_gate();
    for (auto& f : stages) f.wait();
    throw;
  }
  for (auto& f : stages) f.get();  // stage_loop catches everything: nothing to rethrow here
  if (error) std::rethrow_exception(error);
}

}  // namespace tandem
