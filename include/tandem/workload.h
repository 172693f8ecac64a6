// Workload: what a user writes to have tandem run their training step — a data source, zero or
// more no-grad feed stages and one train stage. It holds no mode code: Runner (runner.h) builds
// every mode (serial, pipelined, graphed, pipelined+graphed, graphed_k) from this description,
// and every mode computes the serial loop's losses.
//
//   Workload w;
//   w.name = "frozen-backbone";
//   w.device = device;
//   w.data = DataSource::from_dataset(my_dataset);            // fields "image", "label"
//   w.feeds.push_back({"encode", "backbone", {"image"}, {"features"},
//                      [=](const Tensors& in) { return Tensors{backbone->forward(in[0])}; }});
//   w.train.inputs = {"features", "label"};
//   w.train.loss = [=](const Tensors& in) { return at::cross_entropy_loss(head->forward(in[0]),
//   in[1]); }; w.train.optimizer = std::make_shared<optim::Adam>(head->parameters(),
//   optim::AdamOptions::adamw()); RunOptions o; o.mode = Mode::kPipelinedGraphed;
//   std::vector<float> losses = Runner(w, o).train(1000);
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/detail/batch.h"
#include "tandem/detail/gradient_sync.h"
#include "tandem/loader.h"
#include "tandem/loss_scale.h"
#include "tandem/optim.h"

namespace tandem {

using Tensors = std::vector<at::Tensor>;

/// A stage's device work: `inputs` are the batch fields the stage names, in its order; the
/// result has one tensor per output name. Runs on the current stream (the stage's lane).
using StageFn = std::function<Tensors(const Tensors& inputs)>;

/// A per-stage choice for the graphed modes.
enum class Capture {
  kAllowed,  ///< captured into a CUDA graph where the mode captures
  kNever,    ///< always eager (host syncs, data-dependent shapes, host-side state)
};

/// A no-grad stage that feeds the train stage: GPU augmentation, a frozen backbone, any
/// function of the batch on the device. Runs under at::NoGradGuard.
struct FeedStage {
  std::string name;                  ///< in reports, traces and notes: "encode", "augment"
  std::string lane;                  ///< its lane in the pipelined modes; empty: the name
  std::vector<std::string> inputs;   ///< batch fields it reads, in fn's argument order
  std::vector<std::string> outputs;  ///< batch fields it writes (added, or replacing inputs)
  StageFn fn;
  /// What the stage does, for notes: "uint8->float, frozen encoder".
  std::string what;
  /// CUDA generators fn draws random numbers from: registered with its graph, so each replay
  /// draws fresh numbers, the ones an eager step would (GraphOptions::generators). The default
  /// CUDA generator needs no listing. No other stage may draw from these.
  std::vector<at::Generator> generators;
  Capture capture = Capture::kAllowed;
  /// What the stage measured or decided during the run, for the run's notes after it (empty
  /// function, or empty text: nothing). Called from the thread that asks for the notes.
  std::function<std::string()> report = nullptr;
};

/// A generator of its own for a stage's random draws (FeedStage::generators): a new CUDA
/// generator of `device`'s index, or a new CPU generator, seeded with `seed`. Kept apart from
/// the device's default generator, so the model's own randomness (initialisation, dropout)
/// does not shift what the stage draws, whatever the mode.
at::Generator seeded_generator(c10::Device device, uint64_t seed);

/// The one stage that trains: the runner calls optimizer->zero_grad(), then loss(inputs)
/// (forward and loss over the trainable modules), backward (between gradient_sync's hooks, when
/// set), optimizer->step(), and records the loss on the device (LossLog: no host sync), all on
/// the train lane.
struct TrainStage {
  std::string name = "train";
  std::string lane = "train";
  std::vector<std::string> inputs;
  /// Returns the loss: a one-element float32 tensor that requires grad.
  std::function<at::Tensor(const Tensors& inputs)> loss;
  /// tandem's capturable Sgd / Adam / AdamW, or a LibTorchOptimizer (eager modes only).
  std::shared_ptr<optim::Optimizer> optimizer;
  std::string what;                       ///< for notes: "decoder forward, cross-entropy"
  std::vector<at::Generator> generators;  ///< as FeedStage::generators
  Capture capture = Capture::kAllowed;
  /// Data parallel: averages the gradients over the ranks during backward
  /// (distributed::GradientBuckets, distributed/include/tandem/distributed/data_parallel.h); empty
  /// for one process.
  std::shared_ptr<GradientSync> gradient_sync;
  /// fp16 training: the loss multiplied by the scale before backward, the gradients divided by
  /// it (and checked for inf/NaN) after backward and the gradient sync, the optimizer's step
  /// skipped on the device where they overflowed (optim::Optimizer::skip_steps_where: tandem's
  /// Sgd / Adam / AdamW), the scale updated after it. The recorded loss is the unscaled one.
  /// Empty: no scaling.
  std::shared_ptr<LossScale> loss_scale;
};

/// Where the batches come from.
class DataSource {
 public:
  enum class Kind { kNone, kDataset, kSizedToRun, kResident };
  using DatasetFactory = std::function<std::shared_ptr<const Dataset>(int64_t samples)>;

  /// Host samples of `dataset`, read by the loader's worker threads into pinned slots and
  /// copied to the device on the copy lane. A run longer than an epoch starts another one (with
  /// drop_last, one loader runs on across epochs; each epoch's order, when `shuffle`, that of
  /// PyTorch's DistributedSampler with seed RunOptions::seed and set_epoch(epoch) — torch.randperm
  /// seeded seed + epoch); a short last batch of an epoch is dropped (`drop_last`) or trained on
  /// (the graphed modes run it eagerly: a graph's shapes are fixed).
  static DataSource from_dataset(std::shared_ptr<const Dataset> dataset, bool shuffle = false,
                                 bool drop_last = true);
  /// Host samples of a dataset made for each run and sized to it: `factory(samples)` is called
  /// with the run's sample count (synthetic data; `factory(0)` tells the fields).
  static DataSource sized_to_run(DatasetFactory factory);
  /// Batches already on the device: step i reads batches[i % size]. No loader, no copy.
  static DataSource resident(std::vector<Batch> batches);

  /// The loader's workers run at nice `nice` (LoaderOptions::worker_nice, 0 to kMaxNice): for a
  /// workload whose feed stages keep a host thread of their own busy (workload images' JPEG
  /// engines), so that thread has a core when the workers fill every other.
  DataSource& with_worker_nice(int nice) {
    worker_nice_ = nice;
    return *this;
  }
  int worker_nice() const { return worker_nice_; }

  Kind kind() const { return kind_; }
  /// Host samples read by a loader (kDataset, kSizedToRun), not resident device batches.
  bool on_host() const { return kind_ == Kind::kDataset || kind_ == Kind::kSizedToRun; }
  /// The fields every batch carries, by name.
  std::vector<std::string> field_names() const;
  /// Bytes of one host sample (0 for resident data): what the loader's ring holds per sample.
  int64_t host_sample_bytes() const;
  /// Steps an epoch of a dataset source takes at `batch_size` on each of `world_size` ranks:
  /// the full batches (drop_last), or all of them, the short one included, of a rank's shard
  /// (DistributedSampler: ceil(size / world_size) samples); 0 for the other sources.
  int64_t batches_per_epoch(int64_t batch_size, int64_t world_size = 1) const;

  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  const DatasetFactory& factory() const { return factory_; }
  const std::vector<Batch>& batches() const { return batches_; }
  bool shuffle() const { return shuffle_; }
  bool drop_last() const { return drop_last_; }

 private:
  Kind kind_ = Kind::kNone;
  std::shared_ptr<const Dataset> dataset_;
  DatasetFactory factory_;
  std::vector<Batch> batches_;
  bool shuffle_ = false, drop_last_ = true;
  int worker_nice_ = 0;
};

/// A training step described once. Copyable: the stages' functions share the user's modules.
struct Workload {
  std::string name = "workload";
  /// Where the stages run (lanes); the models and resident batches must be there already.
  c10::Device device = c10::Device(c10::kCPU);
  DataSource data;
  std::vector<FeedStage> feeds;
  TrainStage train;

  /// Throws InvalidArgument naming the first problem: a stage without a function or name, two
  /// stages of one name, a field a stage reads that neither the data source nor an earlier
  /// stage provides, no optimizer.
  void validate() const;
};

/// What a factory of workloads is told (the runner front ends build a fresh instance per run:
/// bench, auto's trials, sweep's points).
struct WorkloadOptions {
  int64_t batch_size = 8;
  /// The loader's worker threads the run will use (0: not said), for a workload that balances
  /// its own stages against the loader's (workload images' decode split).
  int workers = 0;
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 0;  ///< models, data and anything random derive from it
  /// Data parallel: this process's rank among world_size. Models are built from `seed` on every
  /// rank (the same weights); synthetic data and augmentation draw from data_seed().
  int rank = 0, world_size = 1;
  /// The seed of this rank's data: `seed` on rank 0 (so one process and rank 0 draw alike),
  /// another per rank on the others.
  uint64_t data_seed() const { return seed + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull; }
  /// Workload-specific settings, "key" -> "value" (the CLI's --param key=value); a factory
  /// rejects keys it does not know (check_params).
  std::map<std::string, std::string> params;
  /// Where a workload that reads files finds them (the CLI's --data: an ImageFolder, say);
  /// empty for the synthetic ones, which ignore it.
  std::string data;
};
using WorkloadFactory = std::function<Workload(const WorkloadOptions&)>;

/// A workload-specific setting a factory understands, for help texts and validation.
struct WorkloadParam {
  std::string key;
  std::string description;
  std::vector<std::string> choices;  ///< the first is the default; empty: any value
};
/// A workload as the run layer (tandem/run/), the bench front ends and the CLI know it: a
/// factory they call for a fresh instance per run, and what to tell a user about it.
struct WorkloadEntry {
  std::string name;
  std::string description;            ///< one line, for help texts
  int64_t gpu_batch_size = 8;         ///< default batch size on a GPU
  int64_t cpu_batch_size = 2;         ///< and on the CPU (small: a laptop finishes)
  std::vector<WorkloadParam> params;  ///< what --param key=value accepts
  WorkloadFactory make;
};

/// Throws InvalidArgument for a key of `params` not in `known` or a value not among its
/// choices, naming it and what was expected.
void check_params(const std::string& workload, const std::map<std::string, std::string>& params,
                  const std::vector<WorkloadParam>& known);
/// The value of `key` in `params`, else the first choice of its WorkloadParam in `known`.
std::string param_or_default(const std::map<std::string, std::string>& params,
                             const std::vector<WorkloadParam>& known, const std::string& key);

/// Mean cross-entropy of `logits` (B, C, ...) against int64 `labels` (B, ...): the value of
/// CrossEntropyLoss(), computed as per-element losses then a mean, which is deterministic on
/// CUDA (the fused mean reductions of nll_loss/nll_loss2d accumulate with atomics).
at::Tensor deterministic_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace tandem
