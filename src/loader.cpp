// The threaded loader: workers fill a ring of host slots in batch order; see loader.h.
#include "tandem/loader.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <thread>
#include <utility>

#include "tandem/detail/thread_name.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"
#include "tandem/sampler.h"

namespace tandem {

namespace {
std::string describe(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

}  // namespace

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
  int unit = 0;
  while (bytes >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", bytes, kUnits[unit]);
  return text;
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

void Dataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(false, "this dataset implements neither get() nor get_sample(): a dataset ",
                   "with variable-size fields overrides get_sample()");
}

std::string offsets_field(const std::string& name) { return name + "_offsets"; }
std::string sizes_field(const std::string& name) { return name + "_sizes"; }

std::vector<FieldSpec> packed_fields(const std::vector<FieldSpec>& fields) {
  std::vector<FieldSpec> out;
  for (const auto& f : fields) {
    if (!f.variable_size) {
      out.push_back(f);
      continue;
    }
    int64_t typical = 1;
    for (const int64_t d : f.shape) {
      TANDEM_CHECK_ARG(d >= 0, "field '", f.name, "' has dimension ", d, ": expected sizes >= 0");
      typical *= d;
    }
    out.push_back({f.name, {typical}, f.dtype, true, f.stays_on_host});
    out.push_back({offsets_field(f.name), {}, at::kLong, false, f.stays_on_host});
    out.push_back({sizes_field(f.name),
                   {static_cast<int64_t>(f.shape.size())},
                   at::kLong,
                   false,
                   f.stays_on_host});
  }
  return out;
}

int64_t sample_bytes(const std::vector<FieldSpec>& fields) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total = 0;
  for (const auto& field : fields) {
    int64_t bytes = static_cast<int64_t>(c10::elementSize(field.dtype));
    for (const int64_t d : field.shape) {
      TANDEM_CHECK_ARG(d >= 0, "field '", field.name, "' has dimension ", d,
                       ": expected sizes >= 0");
      // Saturating: a shape this large must fail check_ring_fits, not wrap around to a small one.
      if (__builtin_mul_overflow(bytes, d, &bytes)) bytes = kMax;
    }
    if (__builtin_add_overflow(total, bytes, &total)) total = kMax;
  }
  return total;
}

void check_ring_fits(int64_t depth, int64_t batch_size, int64_t sample_bytes) {
  const double memory = physical_memory_bytes();
  if (memory <= 0) return;  // unknown: nothing to check against
  // In floating point: the product of three int64 may not fit in one.
  const double ring = static_cast<double>(depth) * static_cast<double>(batch_size) *
                      static_cast<double>(sample_bytes);
  TANDEM_CHECK_ARG(ring <= memory / 2, "the loader's ring of ", depth, " slots x batch ",
                   batch_size, " x ", format_bytes(static_cast<double>(sample_bytes)),
                   " per sample = ", format_bytes(ring), " exceeds half of this machine's memory (",
                   format_bytes(memory / 2), " of ", format_bytes(memory),
                   "): lower the batch size, the worker count or the loader depth (a runner's "
                   "ring holds 2 x workers + 2 batches)");
}

void check_worker_nice(int nice) {
  TANDEM_CHECK_ARG(nice >= 0 && nice <= kMaxNice, "loader worker nice value ", nice,
                   " is not valid: expected 0 to ", kMaxNice, " (0: the process's priority)");
}

void check_loader_options(const LoaderOptions& options, int64_t sample_bytes) {
  TANDEM_CHECK_ARG(options.batch_size > 0, "batch size ", options.batch_size,
                   " is not valid: expected a positive number of samples");
  TANDEM_CHECK_ARG(options.workers >= 1 && options.workers <= kMaxLoaderWorkers, "worker count ",
                   options.workers, " is not valid: expected 1 to ", kMaxLoaderWorkers,
                   " loader worker threads");
  TANDEM_CHECK_ARG(options.depth >= 1 && options.depth <= kMaxLoaderDepth, "loader depth ",
                   options.depth, " is not valid: expected 1 to ", kMaxLoaderDepth, " host slots");
  check_worker_nice(options.worker_nice);
  TANDEM_CHECK_ARG(options.passes >= 1, "loader pass count ", options.passes,
                   " is not valid: expected >= 1");
  // Before any slot is allocated: a ring larger than memory would otherwise be found by the OS
  // (pinned memory, swap, the OOM killer) rather than reported.
  check_ring_fits(options.depth, options.batch_size, sample_bytes);
}

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  TORCH_CHECK(dataset_, "the loader needs a dataset");
  sample_fields_ = dataset_->fields();
  fields_ = packed_fields(sample_fields_);
  for (size_t s = 0, b = 0; s < sample_fields_.size(); ++s) {
    batch_field_of_.push_back(b);
    b += sample_fields_[s].variable_size ? 3 : 1;
  }
  check_loader_options(options_, sample_bytes(fields_));
  const int64_t size = dataset_->size();
  const int64_t n = options_.indices.empty() ? size : static_cast<int64_t>(options_.indices.size());
  epoch_size_ = n;
  batches_per_pass_ = options_.drop_last ? n / options_.batch_size
                                         : (n + options_.batch_size - 1) / options_.batch_size;
  TANDEM_CHECK_ARG(batches_per_pass_ <= INT64_MAX / options_.passes, "loader pass count ",
                   options_.passes, " of ", batches_per_pass_, " batches is too many");
  num_batches_ = batches_per_pass_ * options_.passes;
  if (!options_.indices.empty()) {
    for (const int64_t i : options_.indices)
      TANDEM_CHECK_ARG(i >= 0 && i < size, "loader index ", i, " is not valid: expected 0 to ",
                       size - 1, " (the dataset has ", size, " samples)");
    order_ = options_.indices;
  } else if (options_.shuffle) {
    order_ = DistributedSampler(n, 1, 0, /*shuffle=*/true, options_.seed).indices(0);
  }

  pinned_ = options_.pin_memory && c10::cuda::device_count() > 0;
  slots_.resize(options_.depth);
  for (auto& slot : slots_) {
    for (const auto& field : fields_) {
      // A variable-size field's slot is an arena of batch_size typical samples (1-D).
      std::vector<int64_t> shape{options_.batch_size};
      if (field.variable_size)
        shape[0] *= field.shape[0];
      else
        shape.insert(shape.end(), field.shape.begin(), field.shape.end());
      slot.fields.push_back(
          at::empty(shape, at::TensorOptions().dtype(field.dtype).pinned_memory(pinned_)));
    }
    slot.packed_used.assign(fields_.size(), 0);
  }
  for (int s = 0; s < options_.depth; ++s) slots_[s].number = s - options_.depth;  // "released"
  worker_state_ = std::make_unique<WorkerState[]>(options_.workers);
  for (int w = 0; w < options_.workers; ++w)
    workers_.emplace_back([this, w] {
      name_this_thread("loader " + std::to_string(w));
      if (options_.worker_nice > 0) {
        const std::string refused = lower_this_thread_priority(options_.worker_nice);
        if (!refused.empty() && w == 0)  // one line for the loader: every worker is refused alike
          std::cerr << "loader: the workers keep the process's priority (nice "
                    << options_.worker_nice << " was refused: " << refused << ")\n";
      }
      worker_loop(w);
    });
}

Loader::~Loader() { stop(); }

void Loader::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = true;
}

void Loader::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
  }
  changed_.notify_all();
}

void Loader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (workers_.empty()) return;
  // Workers leave at their next sample boundary. One still inside a sample after the grace (a
  // read on a hung mount) is left behind: a stop must end. Decided under the guard held
  // exclusively, when no worker is between its get_sample() and its check of `abandoned`.
  const auto deadline = std::chrono::steady_clock::now() + kLoaderStopGrace;
  std::vector<bool> stuck(workers_.size(), false);
  std::string report;
  for (;;) {
    bool busy = false;
    for (size_t w = 0; w < workers_.size(); ++w) busy = busy || worker_state_[w].sample >= 0;
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (!busy || late) {
      std::unique_lock<std::shared_mutex> hold(guard_->mutex);
      busy = false;
      for (size_t w = 0; w < workers_.size(); ++w) {
        stuck[w] = worker_state_[w].sample >= 0;
        busy = busy || stuck[w];
      }
      if (!busy || late) {
        guard_->abandoned = busy;
        if (busy) report = busy_workers();
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!report.empty())
    std::cerr << "loader: stopped with " << report << "; left running, detached\n";
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (stuck[w])
      workers_[w].detach();
    else if (workers_[w].joinable())
      workers_[w].join();
  }
  workers_.clear();
}

std::string Loader::busy_workers() const {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  std::string text;
  for (int w = 0; w < options_.workers; ++w) {
    const int64_t sample = worker_state_[w].sample;
    if (sample < 0) continue;
    const std::string source = dataset_->sample_source(sample);
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f",
                  static_cast<double>(now - worker_state_[w].since_ns) * 1e-9);
    text += detail::concat(text.empty() ? "" : "; ", "worker ", w, " on sample ", sample,
                           source.empty() ? "" : " ('" + source + "')", " for ", seconds, " s");
  }
  return text;
}

namespace {
// A dataset's variable-size sample: defined, contiguous on the CPU, of the declared dtype and
// rank. Throws InvalidArgument saying which it is not.
void check_variable(const FieldSpec& field, const at::Tensor& t) {
  TANDEM_CHECK_ARG(t.defined(), "the dataset gave no tensor for variable-size field '", field.name,
                   "'");
  TANDEM_CHECK_ARG(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == field.dtype &&
                       t.dim() == static_cast<int64_t>(field.shape.size()),
                   "the dataset's tensor for field '", field.name, "' is ", t.scalar_type(), " ",
                   t.sizes(), " on ", t.device(), ": expected a contiguous CPU tensor of ",
                   field.dtype, " with ", field.shape.size(), " dimensions");
}
}  // namespace

int64_t Loader::index_at(int64_t position) const {
  return order_.empty() ? position : order_[position];
}

namespace {
// dataset.get_drawn_sample(index, draw, views), its failure as a message ("" if none). Touches
// nothing of the loader: the loader may be gone when a stuck call returns (Loader::stop).
std::string load_sample(const Dataset& dataset, int64_t index, const SampleDraw& draw,
                        std::vector<at::Tensor>& views) {
  try {
    dataset.get_drawn_sample(index, draw, views);
    return {};
  } catch (const std::exception& e) {
    return describe(e);
  } catch (...) {
    return "unknown exception";
  }
}
}  // namespace

void Loader::worker_loop(int worker) {
  // Our own references: a worker abandoned inside a sample outlives the loader (stop()).
  const std::shared_ptr<WorkerGuard> guard = guard_;
  std::shared_lock<std::shared_mutex> held(guard->mutex);
  if (guard->abandoned) return;
  const std::shared_ptr<const Dataset> dataset = dataset_;
  WorkerState& state = worker_state_[worker];
  const std::string track = "loader worker " + std::to_string(worker);
  const int D = options_.depth;
  const int64_t n = epoch_size_;
  for (;;) {
    int64_t number;
    Slot* slot;
    bool wait_copy;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stopping_ || next_to_claim_ >= num_batches_) return;
      number = next_to_claim_++;
      slot = &slots_[number % D];
      // The slot is ours once its previous batch (number - D) has been released.
      changed_.wait(lock, [&] {
        return stopping_ || (slot->state == SlotState::kFree && slot->number == number - D);
      });
      if (stopping_) return;
      slot->state = SlotState::kFilling;
      slot->number = number;
      wait_copy = slot->copied_pending;
      slot->copied_pending = false;
    }
    // Nobody else touches a slot while it is kFilling, so this runs without the lock. (On the
    // heap: an abandoned worker leaks it rather than write to a trace that may be gone.)
    auto span = std::make_unique<HostSpan>(options_.trace, track, "batch " + std::to_string(number),
                                           number);
    if (wait_copy) slot->copied->synchronize();
    std::string error;
    std::vector<SkippedSample> skipped;
    // Its pass, and where it starts in that pass's order (each pass cut into batches alone).
    const int64_t pass = number / batches_per_pass_;
    const int64_t first = (number % batches_per_pass_) * options_.batch_size;
    const int64_t count = std::min<int64_t>(options_.batch_size, n - first);
    slot->indices.clear();
    slot->indices.reserve(count);
    // Variable-size samples are collected here and packed once the batch is complete (the
    // arena's size is known only then).
    std::vector<std::vector<at::Tensor>> variable(sample_fields_.size());
    std::vector<at::Tensor> views(sample_fields_.size());
    for (int64_t i = 0; i < count && error.empty(); ++i) {
      if (paused_.load(std::memory_order_relaxed)) {  // out of any sample: stop() sees it idle
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !paused_; });
        if (stopping_) break;
      }
      const int64_t index = index_at(first + i);
      const int64_t row = static_cast<int64_t>(slot->indices.size());  // skipped ones leave none
      std::string failure;
      try {
        for (size_t f = 0; f < sample_fields_.size(); ++f)
          views[f] = sample_fields_[f].variable_size
                         ? at::Tensor()
                         : slot->fields[batch_field_of_[f]].select(0, row);
      } catch (const std::exception& e) {
        failure = describe(e);
      }
      if (failure.empty()) {
        state.since_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
        state.sample = index;
        const SampleDraw draw{options_.draw_seed, static_cast<uint64_t>(options_.first_position +
                                                                        pass * n + first + i)};
        held.unlock();
        failure = load_sample(*dataset, index, draw, views);
        held.lock();
        if (guard->abandoned) {
          (void)span.release();
          return;
        }
        state.sample = -1;
      }
      try {
        for (size_t f = 0; f < sample_fields_.size() && failure.empty(); ++f)
          if (sample_fields_[f].variable_size) check_variable(sample_fields_[f], views[f]);
      } catch (const std::exception& e) {
        failure = describe(e);
      }
      if (failure.empty()) {
        slot->indices.push_back(index);
        for (size_t f = 0; f < sample_fields_.size(); ++f)
          if (sample_fields_[f].variable_size) variable[f].push_back(std::move(views[f]));
      } else if (options_.skip_bad) {
        skipped.push_back({index, std::move(failure)});
      } else {
        error = detail::concat("loader worker failed on sample ", index, " (batch ", number,
                               "): ", failure);
      }
      if (stopping_) break;  // a racy read is fine: it only shortens the fill
    }
    if (error.empty() && count > 0 && slot->indices.empty())
      error = detail::concat("every sample of batch ", number, " was bad (the last: sample ",
                             skipped.back().index, ": ", skipped.back().reason, ")");
    if (error.empty()) {
      try {
        pack(*slot, variable, static_cast<int64_t>(slot->indices.size()));
      } catch (const std::exception& e) {
        error = detail::concat("loader worker failed packing batch ", number, ": ", describe(e));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot->error = std::move(error);
      slot->state = slot->error.empty() ? SlotState::kReady : SlotState::kFailed;
      skipped_.insert(skipped_.end(), std::make_move_iterator(skipped.begin()),
                      std::make_move_iterator(skipped.end()));
    }
    changed_.notify_all();
  }
}

std::optional<HostBatch> Loader::next() {
  std::vector<at::Tensor> retired;  // freed here, on the consumer's thread, after the lock
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_ || next_to_deliver_ >= num_batches_) return std::nullopt;
  const int64_t number = next_to_deliver_;
  Slot& slot = slots_[number % options_.depth];
  auto ready = [&] {
    return stopping_ || (slot.number == number &&
                         (slot.state == SlotState::kReady || slot.state == SlotState::kFailed));
  };
  if (!ready()) {  // the workers are behind: the consumer waits (a span in the trace)
    HostSpan span(options_.trace, "loader consumer", "wait for batch " + std::to_string(number),
                  number);
    if (!options_.cancel) changed_.wait(lock, ready);
    while (!ready() && !changed_.wait_for(lock, kLoaderCancelPoll, ready)) {
      if (options_.cancel->load() == 0) continue;
      const std::string busy = busy_workers();
      throw LoaderError(detail::concat("stop requested while waiting for batch ", number, ": ",
                                       busy.empty() ? "no worker is inside a sample" : busy));
    }
  }
  if (stopping_) return std::nullopt;
  retired.swap(slot.retired);
  if (slot.state == SlotState::kFailed) throw LoaderError(slot.error);  // stays failed
  slot.state = SlotState::kInUse;
  ++next_to_deliver_;
  HostBatch batch;
  batch.number = number;
  batch.slot = static_cast<int>(number % options_.depth);
  batch.indices = slot.indices;
  batch.fields = slot.fields;
  const int64_t count = static_cast<int64_t>(slot.indices.size());
  for (size_t f = 0; f < batch.fields.size(); ++f) {
    if (fields_[f].variable_size)
      batch.fields[f] = batch.fields[f].narrow(0, 0, slot.packed_used[f]);
    else if (count < options_.batch_size)  // a short last batch, or samples skipped
      batch.fields[f] = batch.fields[f].narrow(0, 0, count);
  }
  return batch;
}

std::vector<SkippedSample> Loader::skipped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return skipped_;
}

void Loader::pack(Slot& slot, const std::vector<std::vector<at::Tensor>>& variable, int64_t count) {
  for (size_t s = 0; s < sample_fields_.size(); ++s) {
    if (!sample_fields_[s].variable_size) continue;
    const size_t b = batch_field_of_[s];
    int64_t total = 0;
    for (const at::Tensor& t : variable[s]) total += t.numel();
    at::Tensor& arena = slot.fields[b];
    if (total > arena.numel()) {
      // Grown with headroom, so a slot settles after a few batches. The old arena is unused:
      // this slot's previous copy out of it has completed (the fill waited for it); the
      // consumer frees it (Slot::retired).
      at::Tensor grown =
          at::empty({total + total / 4},
                    at::TensorOptions().dtype(arena.scalar_type()).pinned_memory(pinned_));
      slot.retired.push_back(std::exchange(arena, std::move(grown)));
    }
    const int64_t rank = static_cast<int64_t>(sample_fields_[s].shape.size());
    int64_t* offsets = slot.fields[b + 1].data_ptr<int64_t>();
    int64_t* sizes = slot.fields[b + 2].data_ptr<int64_t>();
    const size_t element = arena.element_size();
    auto* base = static_cast<uint8_t*>(arena.data_ptr());
    int64_t at_element = 0;
    for (int64_t i = 0; i < count; ++i) {
      const at::Tensor& t = variable[s][i];
      offsets[i] = at_element;
      for (int64_t d = 0; d < rank; ++d) sizes[i * rank + d] = t.size(d);
      std::memcpy(base + at_element * element, t.data_ptr(), t.numel() * element);
      at_element += t.numel();
    }
    slot.packed_used[b] = total;
  }
}

void Loader::release(const HostBatch& batch, const Lane* lane) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(batch.slot >= 0 && batch.slot < options_.depth, "release of an invalid slot ",
                batch.slot);
    Slot& slot = slots_[batch.slot];
    TORCH_CHECK(slot.state == SlotState::kInUse && slot.number == batch.number, "release of batch ",
                batch.number, " which is not in use");
    if (lane && lane->is_cuda()) {
      if (!slot.copied) slot.copied.emplace();
      slot.copied->record(lane->stream());
      slot.copied_pending = true;
    }
    slot.state = SlotState::kFree;
  }
  changed_.notify_all();
}

void load_next_batch(Loader& loader, Batch& batch, const Lane& lane) {
  std::optional<HostBatch> host = loader.next();
  TORCH_CHECK(host.has_value(), "the loader ran out of batches at step ", batch.index);
  const auto& fields = loader.fields();
  for (size_t f = 0; f < fields.size(); ++f) {
    const at::Tensor& slot = host->fields[f];
    at::Tensor t;
    if (!lane.is_cuda()) {
      t = slot.clone();
    } else if (!fields[f].stays_on_host) {
      t = slot.to(lane.device(), /*non_blocking=*/true);
    } else {
      // Into LibTorch's pinned host allocator: its blocks are reused, where a clone's tens of
      // megabytes of JPEG bytes were fresh pages each batch (faulted in and zeroed on this
      // thread), and the JPEG engines can read the batch in place (decode_on_device).
      t = at::empty(slot.sizes(), slot.options().pinned_memory(true));
      t.copy_(slot);
    }
    batch.set(fields[f].name, std::move(t));
  }
  loader.release(*host, &lane);
}

}  // namespace tandem
