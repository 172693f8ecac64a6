// A threaded loader: W worker threads fill batches of samples into a ring of D host slots
// (pinned when CUDA is present), in order, so a copy lane can move them to the device while
// the workers fill the next ones. The C++ counterpart of a DataLoader with workers.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/detail/batch.h"
#include "tandem/detail/lane.h"
#include "tandem/detail/trace.h"

namespace tandem {

/// One field of a sample, e.g. {"image", {3, 256, 256}, kByte}.
struct FieldSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  /// Samples differ in size (images decoded at their own height and width): `shape` is then a
  /// typical sample's, which sizes the loader's slots (a slot grows when a batch needs more);
  /// only its rank binds. A batch carries such a field packed — see packed_fields().
  bool variable_size = false;
  /// The load stage hands the stages a host copy of this field instead of a device copy: bytes a
  /// host library reads, such as JPEG bitstreams for nvJPEG (which moves them itself).
  bool stays_on_host = false;
};

/// The names under which a batch carries variable-size field `name`: `name` itself is every
/// sample's elements back to back, a 1-D tensor; `name`_offsets (B,) int64 is where sample b
/// starts in it and `name`_sizes (B, rank) int64 is its shape. Sample b is
/// packed.narrow(0, offsets[b], prod(sizes[b])).view(sizes[b]).
std::string offsets_field(const std::string& name);
std::string sizes_field(const std::string& name);

/// The fields a batch carries for samples of `fields`: each fixed-size field as it is, each
/// variable-size one as its packed field (shape: the typical sample's element count) followed by
/// its offsets and sizes fields.
std::vector<FieldSpec> packed_fields(const std::vector<FieldSpec>& fields);

/// A source of samples. get() is called concurrently from worker threads, so it must be
/// thread-safe, and it must be a pure function of the index (reproducible, order-independent).
/// The key of a sample's random draws: a seed (the run's, mixed with the rank) and the sample's
/// position in the stream the loader hands out (LoaderOptions::first_position + its place in
/// the loader's order), not its dataset index: a sample drawn twice (two epochs) draws anew.
struct SampleDraw {
  uint64_t seed = 0;
  uint64_t position = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::vector<FieldSpec> fields() const = 0;
  /// Writes sample `index` into `out`: one contiguous CPU tensor per field, of the declared
  /// shape and dtype (views into a batch slot; write into them, do not replace them). Datasets
  /// with fixed-size fields only override this.
  virtual void get(int64_t index, const std::vector<at::Tensor>& out) const;
  /// What the loader calls. `out` holds a slot view for each fixed-size field, as get()'s, and
  /// an undefined tensor for each variable-size one, which the dataset sets to the sample's own
  /// contiguous CPU tensor (declared dtype and rank; the loader packs it into the slot). The
  /// default calls get(); datasets with variable-size fields override this instead.
  virtual void get_sample(int64_t index, std::vector<at::Tensor>& out) const { get(index, out); }
  /// What the loader calls, with the sample's draw key (SampleDraw): get_sample() unless the
  /// dataset draws randomness per sample (a random crop chosen before decoding), which it then
  /// takes from SampleRng(draw.seed, draw.position) — the same draws whichever worker fills the
  /// sample, in any mode, and again in a resumed run. Wrappers forward it.
  virtual void get_drawn_sample(int64_t index, const SampleDraw& draw,
                                std::vector<at::Tensor>& out) const {
    (void)draw;
    get_sample(index, out);
  }
  /// What sample `index` is read from (a file's path), for messages; "" when there is nothing
  /// to name. Called from any thread, also while a worker is inside get() of that index.
  virtual std::string sample_source(int64_t index) const { return {}; }
};

/// The ring a pool of `workers` needs to keep every worker busy: a worker fills a whole batch
/// in a slot of its own, so one slot per worker, plus the batch the copy lane is reading and the
/// next one ready for it — and as many again, because batches are handed over in order: a
/// worker that finished early claims the next batch only once that batch's slot was released,
/// so one slow batch would idle the others. (With fewer slots workers idle: on the H200, 4 slots
/// for 8 workers ran cls's cpu_aug at half speed; with workers + 2, 15 workers filling batches
/// of large photos in 0.6 to 0.95 s each were idle for 18% of a run, waiting for slots.)
inline int ring_slots_for(int workers) { return 2 * workers + 2; }

/// Bounds on LoaderOptions, checked before anything is allocated: more threads or slots than
/// these are a typo, not a configuration.
constexpr int kMaxLoaderWorkers = 1024;
constexpr int kMaxLoaderDepth = 4096;

/// The host bytes of one sample: the sum over `fields` of numel(shape) x element size
/// (saturating at INT64_MAX). Throws InvalidArgument naming a field with a negative dimension.
int64_t sample_bytes(const std::vector<FieldSpec>& fields);

/// This machine's physical memory in bytes, or 0 where the system does not say.
double physical_memory_bytes();

/// `bytes` for a message: "708.0 KiB", one decimal, binary units.
std::string format_bytes(double bytes);

/// Throws InvalidArgument unless a ring of `depth` slots of `batch_size` samples of
/// `sample_bytes` bytes each fits in half of this machine's physical memory; what() gives the
/// arithmetic. Cheap: call it before building a dataset or a loader (the Loader calls it too).
void check_ring_fits(int64_t depth, int64_t batch_size, int64_t sample_bytes);

struct LoaderOptions {
  int64_t batch_size = 8;
  int workers = 4;  ///< worker threads
  int depth = 4;    ///< host slots in the ring: batches filled ahead of the consumer
  /// The workers' nice value, 0 to kMaxNice (thread_sched.h): above 0 they run at a lower
  /// priority than the process's other threads, which then get a core first whenever every
  /// core is busy (a feed stage's thread that waits on the GPU in short spins, the step's
  /// launches). 0: the process's priority.
  int worker_nice = 0;
  bool pin_memory = true;  ///< pinned slots (only when CUDA is present), so copies are async
  /// Visit the indices in a seeded random permutation: DistributedSampler's (sampler.h) for
  /// `seed`, epoch 0 — torch.randperm's order, as PyTorch's sampler would give.
  bool shuffle = false;
  /// If not empty: the epoch visits exactly these dataset indices, in this order (e.g. a
  /// DistributedSampler's for one rank and epoch); each in [0, size). Overrides shuffle.
  std::vector<int64_t> indices;
  bool drop_last = true;  ///< drop a final short batch
  /// The order visited this many times back to back, each pass cut into batches of its own (its
  /// last one short unless drop_last): an evaluation's loader serves every evaluation of a run,
  /// so its workers start once and fill the next pass's first batches ahead. >= 1.
  int64_t passes = 1;
  /// A sample whose get_sample() throws is left out of its batch (which is then shorter),
  /// counted and reported (Loader::skipped()), instead of failing the batch.
  bool skip_bad = false;
  uint64_t seed = 0;
  /// Dataset::get_drawn_sample's key: draw_seed, and first_position plus the sample's place in
  /// this loader's order (a runner counts positions over its whole run, so a loader made for a
  /// later epoch or a resumed run carries on where the stream was).
  uint64_t draw_seed = 0;
  int64_t first_position = 0;
  Trace* trace = nullptr;  ///< if set: each worker's fills, and the consumer's waits
  /// If set: a stop request, when nonzero (a run's stop flag, set by a signal handler). next()
  /// waiting for a batch looks at it every kLoaderCancelPoll and, once set, throws LoaderError
  /// naming the batch and the sample each busy worker has been on, and for how long — so a stop
  /// ends a run even while a worker is stuck in a read (a hung network mount).
  const std::atomic<int>* cancel = nullptr;
};

/// How often a waiting next() looks at LoaderOptions::cancel.
constexpr std::chrono::milliseconds kLoaderCancelPoll{100};
/// How long stop() waits for a worker to leave the sample it is on; one still in it then (stuck
/// in a read) is left behind, detached, with one line on stderr naming the sample: it touches
/// nothing of the loader when it comes back, and its dataset stays alive until it does.
constexpr std::chrono::milliseconds kLoaderStopGrace{2000};

/// Throws InvalidArgument unless `nice` is a loader workers' nice value, 0 to kMaxNice
/// (LoaderOptions::worker_nice): what check_loader_options checks, for a caller that holds the
/// value long before it builds a loader (a training job's options).
void check_worker_nice(int nice);

/// What the Loader's constructor checks before it allocates anything: batch size > 0, workers in
/// [1, kMaxLoaderWorkers], depth in [1, kMaxLoaderDepth], worker_nice in [0, kMaxNice], and
/// that the ring fits
/// (check_ring_fits). Throws InvalidArgument naming the first bad value. Callable before a
/// dataset exists (a runner checks its options at construction with it).
void check_loader_options(const LoaderOptions& options, int64_t sample_bytes);

/// A sample the loader left out (LoaderOptions::skip_bad): its index and why.
struct SkippedSample {
  int64_t index = -1;
  std::string reason;
};

/// A filled slot handed to the consumer: fields[f] is (B, ...shape) on the host for a fixed-size
/// field, packed for a variable-size one (Loader::fields(): packed_fields() of the dataset's).
struct HostBatch {
  int64_t number = -1;           ///< 0, 1, ... within the loader (every pass)
  int slot = -1;                 ///< ring slot, for Loader::release
  std::vector<int64_t> indices;  ///< dataset indices of the B samples, in order
  std::vector<at::Tensor> fields;
};

/// Delivers every index of the epoch exactly once, in batch order.
///
///   worker k:  claim batch b ── wait slot b%D free ── fill B samples ── mark ready
///   consumer:  next() waits for batch n ready ── copy H2D on a lane ── release(n, lane)
///   release:   records an event on the lane; the worker that refills the slot waits for that
///              event first, so a pinned slot is never overwritten while a copy still reads it.
///
/// A worker's exception is re-thrown by next() as LoaderError naming the sample index.
/// Destruction (or stop()) mid-epoch wakes and joins every worker; nothing is left running but a
/// worker stuck inside a sample for longer than kLoaderStopGrace (see there).
class Loader {
 public:
  /// Throws InvalidArgument, before allocating a slot or starting a thread, unless the batch
  /// size is positive, workers in [1, kMaxLoaderWorkers], depth in [1, kMaxLoaderDepth], and
  /// the ring fits (check_ring_fits).
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Every pass's batches (LoaderOptions::passes).
  int64_t num_batches() const { return num_batches_; }
  /// One pass's.
  int64_t batches_per_pass() const { return batches_per_pass_; }
  /// What each batch carries: packed_fields() of the dataset's fields.
  const std::vector<FieldSpec>& fields() const { return fields_; }
  /// The samples left out so far (skip_bad), in the order the workers met them.
  std::vector<SkippedSample> skipped() const;

  /// The next batch in order; blocks the host until it is filled. nullopt after the last one.
  std::optional<HostBatch> next();
  /// Gives the slot back. If `lane` is a CUDA lane, the slot is refilled only after the work
  /// enqueued on it so far (the copy out of the slot) has completed.
  void release(const HostBatch& batch, const Lane* lane = nullptr);
  /// Stops and joins the workers; further next() calls return nullopt.
  void stop();
  /// Holds every worker at its next sample boundary (a sample being loaded finishes) until
  /// resume(), so other work (an evaluation's loader) has the cores; next() waits meanwhile for
  /// a batch not yet filled. Any thread; stop() ends a pause.
  void pause();
  void resume();

 private:
  enum class SlotState { kFree, kFilling, kReady, kInUse, kFailed };
  struct Slot {
    SlotState state = SlotState::kFree;
    int64_t number = -1;
    std::vector<at::Tensor> fields;    // per batch field; a variable-size one's is its arena
    std::vector<int64_t> packed_used;  // per batch field: elements of the arena in use
    std::vector<int64_t> indices;
    std::optional<at::cuda::CUDAEvent> copied;  // recorded by release(); waited before refill
    bool copied_pending = false;
    std::string error;
    // Arenas pack() outgrew, freed by the consumer (next()), never by a worker: freeing a pinned
    // block records an event on each stream that copied from it, and a worker's record on a
    // stream another thread is capturing (serial graphed modes capture on the lane that copies)
    // would land in that graph, an event no later query accepts (CUDA: invalid argument).
    std::vector<at::Tensor> retired;
  };

  // What a worker is on: the sample index while it is inside get_sample() (-1 otherwise) and
  // since when (steady clock, ns). Written by the worker, read by stop() and a cancelled next().
  struct WorkerState {
    std::atomic<int64_t> sample{-1};
    std::atomic<int64_t> since_ns{0};
  };
  // Each worker holds `mutex` shared whenever it is not inside get_sample(), so stop(), holding
  // it exclusively, sees every worker either out of the loader or inside a sample. A worker
  // stuck in one is then abandoned (detached): coming back, it sees `abandoned` in its own copy
  // of this and returns without touching the loader, which may be gone.
  struct WorkerGuard {
    std::shared_mutex mutex;
    bool abandoned = false;
  };

  void worker_loop(int worker);
  // "worker 1 has been on sample 17 ('a/b.jpg') for 3.2 s", for each worker inside a sample.
  std::string busy_workers() const;
  int64_t index_at(int64_t position) const;
  // Packs the variable-size samples `variable[v][i]` into `slot`'s arenas, growing them.
  void pack(Slot& slot, const std::vector<std::vector<at::Tensor>>& variable, int64_t count);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  std::vector<FieldSpec> sample_fields_;  // the dataset's
  std::vector<FieldSpec> fields_;         // a batch's: packed_fields(sample_fields_)
  // For sample field s: its batch field, and for a variable-size one its offsets' and sizes'.
  std::vector<size_t> batch_field_of_;
  bool pinned_ = false;
  std::vector<SkippedSample> skipped_;  // guarded by mutex_
  int64_t num_batches_ = 0;
  int64_t batches_per_pass_ = 0;
  int64_t epoch_size_ = 0;      // samples one pass visits
  std::vector<int64_t> order_;  // empty unless shuffling

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;
  int64_t next_to_claim_ = 0;
  int64_t next_to_deliver_ = 0;
  bool stopping_ = false;
  std::atomic<bool> paused_{false};  // written under mutex_; workers peek at it per sample
  std::vector<std::thread> workers_;
  std::unique_ptr<WorkerState[]> worker_state_;
  std::shared_ptr<WorkerGuard> guard_ = std::make_shared<WorkerGuard>();
};

/// The load stage of every host data source (the runner's): takes the loader's next batch, copies
/// each field to `lane`'s device on that lane (asynchronously from pinned memory), or to host
/// memory of its own (on the CPU, or for a FieldSpec::stays_on_host field: the slot is refilled
/// once released), sets it in `batch` under the field's name, and releases the slot behind the
/// copy. Throws if the loader has no batch left.
void load_next_batch(Loader& loader, Batch& batch, const Lane& lane);

}  // namespace tandem
