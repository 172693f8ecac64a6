// Helpers the train jobs share (classifier.cpp, segmenter.cpp): subsets and splits of a
// dataset, the trainable tensors of a model, and weights loaded by name.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loader_workers.h"
#include "tandem/detail/batch.h"
#include "tandem/detail/lane.h"
#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/models/safetensors.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/classifier.h"

namespace tandem::train::detail {

// The options with their loader worker count resolved: 0 is every front end's rule for the
// device (as a Trainer resolves its TrainOptions').
inline ClassifierOptions with_loader_workers(ClassifierOptions o) {
  o.workers = loader_workers(o.workers, o.device);
  return o;
}

// Samples `indices` of another dataset (a subset, or one side of a split).
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
      : base_(std::move(base)), indices_(std::move(indices)) {}
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  std::vector<FieldSpec> fields() const override { return base_->fields(); }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    base_->get(indices_.at(static_cast<size_t>(index)), out);
  }
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override {
    base_->get_sample(indices_.at(static_cast<size_t>(index)), out);
  }
  void get_drawn_sample(int64_t index, const SampleDraw& draw,
                        std::vector<at::Tensor>& out) const override {
    base_->get_drawn_sample(indices_.at(static_cast<size_t>(index)), draw, out);
  }
  std::string sample_source(int64_t index) const override {
    return base_->sample_source(indices_.at(static_cast<size_t>(index)));
  }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

// n indices spread evenly over [0, size): every class of a class-ordered folder is drawn from.
inline std::vector<int64_t> spread(int64_t size, int64_t n) {
  std::vector<int64_t> out;
  n = std::min(n, size);
  for (int64_t i = 0; i < n; ++i) out.push_back(i * size / n);
  return out;
}

inline std::shared_ptr<const Dataset> take(std::shared_ptr<const Dataset> d, int64_t n) {
  if (n <= 0 || n >= d->size()) return d;
  return std::make_shared<SubsetDataset>(d, spread(d->size(), n));
}

// The model's trainable tensors, for the optimizer.
inline std::vector<at::Tensor> trainable(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// Loads `path` into `model` by name. A classifier `fc` of another class count (torchvision's
// ImageNet weights on a 10-class folder) keeps the model's own fresh head, said on stderr; any
// other missing, unexpected or mis-shaped tensor is an error listing them (load_state_dict).
inline void load_weights(torch::nn::Module& model, const std::string& path) {
  models::NamedTensors file = models::load_safetensors(path);
  const models::NamedTensors own = models::state_dict(model);
  auto own_of = [&](const std::string& k) -> const at::Tensor* {
    for (const auto& [name, t] : own)
      if (name == k) return &t;
    return nullptr;
  };
  const at::Tensor* fc = own_of("fc.weight");
  bool head_replaced = false;
  for (auto& [name, t] : file)
    if (fc && (name == "fc.weight" || name == "fc.bias") && own_of(name) &&
        t.sizes() != own_of(name)->sizes()) {
      t = own_of(name)->detach().cpu();
      head_replaced = true;
    }
  if (head_replaced)
    std::cerr << "weights " << path << ": its fc has another class count; the head starts fresh ("
              << fc->size(0) << " classes)\n";
  try {
    models::load_state_dict(model, file, /*strict=*/true);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("weights " + path + " do not fit the model: " + e.what());
  }
}

/// What every job's resume must match (Trainer refuses a checkpoint of another config); the job
/// adds its own keys. Paths are resolved (realpath), so the same folder under another spelling
/// is the same config; the Trainer identifies "data" and "val" by their content besides.
inline nlohmann::json common_config(const ClassifierOptions& o, const std::string& model, double lr,
                                    double weight_decay) {
  return {{"model", model},
          {"data", resolve_path(o.data)},
          {"val", resolve_path(o.val)},
          {"val_split", o.val_split},
          {"subset", o.subset},
          {"val_subset", o.val_subset},
          {"optimizer", o.optimizer},
          {"lr", lr},
          {"momentum", o.momentum},
          {"weight_decay", weight_decay},
          {"precision", to_string(o.precision)},
          {"weights", resolve_path(o.weights)}};
}

/// A classifier's evaluation metrics: the fraction of `n` samples predicted right and their
/// mean cross-entropy.
inline Metrics accuracy_metrics(int64_t correct, double loss_sum, int64_t n) {
  return {{"accuracy", n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0},
          {"val_loss", n > 0 ? loss_sum / static_cast<double>(n) : 0}};
}

/// The fewest ring slots an evaluation's loader gets: one per worker and two spare — not the
/// training's deeper ring_slots_for. Its parts are a few samples each, so a slow one holds the
/// others little, and a deeper ring lets a pass's reads run into the next pass's while the
/// first are still in flight (a sample of a KeptSamples set read twice before it is kept).
inline int eval_ring_floor(int workers) { return workers + 2; }

/// Loader settings for an evaluation pass: every sample once, in order, the short last batch
/// included.
inline LoaderOptions eval_loader_options(int64_t batch_size, int workers) {
  LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.workers = workers;
  lo.depth = eval_ring_floor(workers);
  lo.drop_last = false;
  return lo;
}

/// How many samples an evaluation's loader batch holds: the largest divisor of `batch_size` not
/// above batch_size / workers (rounded up). A Loader fills each of its batches with one worker,
/// so an evaluation of a few full batches keeps most workers idle (1 500 photos in batches of 256
/// decode on 6 of 15 cores, while training hides that behind the ring's depth); parts this size
/// keep every worker decoding, and whole parts make a batch of exactly `batch_size` again.
inline int64_t eval_part_size(int64_t batch_size, int workers) {
  const int64_t w = std::max(1, workers);
  int64_t part = std::max<int64_t>(1, (batch_size + w - 1) / w);
  while (batch_size % part != 0) --part;
  return part;
}

/// Samples an evaluation's ring may hold decoded ahead, beyond the workers' own slots: a
/// held-out set this small is decoded whole while the training runs, so its evaluation never
/// waits for a part decoded on one core (a part of 16 photos of 320-640 px is ~16 ms, as long as
/// the forward of 300 images). The bound keeps the pinned ring small (~0.25-0.6 MB a photo
/// decoded at Resize's scale: a few hundred MB at most).
constexpr int64_t kEvalAheadSamples = 512;

/// The ring slots (parts) of an evaluation's loader over `samples` held-out samples: the
/// workers' own (eval_ring_floor), or every part of a pass where those hold no more than
/// kEvalAheadSamples.
inline int eval_ring_slots(int64_t samples, int64_t batch_size, int workers) {
  const int64_t part = eval_part_size(batch_size, workers);
  const int64_t parts = (samples + part - 1) / part;
  const int64_t ahead = std::min(parts, std::max<int64_t>(1, kEvalAheadSamples / part));
  return static_cast<int>(std::max<int64_t>(eval_ring_floor(workers), ahead));
}

/// An evaluation batch `x` of fewer than `batch_size` samples (a pass's last) with zero samples
/// appended up to `batch_size`, in x's memory format, where `pad` (the evaluation is on CUDA);
/// else x itself. The caller forwards it and keeps the first x.size(0) rows of the output. Why:
/// cuDNN tunes each convolution per input shape, so a batch of a size the run never had tuned
/// every convolution of the model again on the first evaluation (0.73 s of ResNet-18's first
/// evaluation of 300 photos on an H100, 256 + 44, where later ones took 0.016 s); at the
/// training's batch size the training's thread, which evaluates, has tuned them all. The model
/// is in eval mode, where every layer treats each sample alone, so the real samples' outputs
/// are the same. The price: the padding's forward at every evaluation (300 photos: 0.022 s).
inline at::Tensor padded_to_the_batch_size(const at::Tensor& x, int64_t batch_size, bool pad) {
  const int64_t n = x.size(0);
  if (!pad || n == 0 || n >= batch_size) return x;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[0] = batch_size - n;
  return at::cat({x, at::zeros(sizes, x.options())}).contiguous(x.suggest_memory_format());
}

/// How many evaluations one EvalPasses loader serves before the next is made (its workers are
/// up for them all; the order is not copied per pass, so a large number costs nothing).
constexpr int64_t kEvalPassesPerLoader = 1024;

/// Every evaluation of a run over `data`, from one loader whose workers start once: a pass is
/// the loader's parts (eval_part_size) loaded on the lane, each turned into device tensors by
/// `prepare` (the model's inputs and targets, dim 0 the samples), concatenated over the parts of
/// `batch_size` samples (the last batch shorter) and handed to `consume`; each tensor keeps its
/// part's memory format. The workers start when the passes are made, so the first pass's first
/// parts (the ring's depth) decode while the first epoch trains, and between two passes they
/// fill the next pass's: an evaluation starts on decoded parts instead of starting threads and
/// waiting for a whole part's decode. (A loader per evaluation did both every epoch; a loader
/// made at the first evaluation left the first to decode from its start.)
/// Not thread-safe: one evaluation at a time.
class EvalPasses {
 public:
  /// `worker_nice`: LoaderOptions::worker_nice of its loaders.
  EvalPasses(std::shared_ptr<const Dataset> data, int64_t batch_size, int workers,
             int worker_nice = 0)
      : data_(std::move(data)),
        batch_size_(batch_size),
        workers_(workers),
        worker_nice_(worker_nice) {
    start_loader();
  }

  void run(const Lane& lane, const std::function<std::vector<at::Tensor>(Batch&)>& prepare,
           const std::function<void(const std::vector<at::Tensor>&)>& consume) {
    if (!loader_ || passes_done_ == kEvalPassesPerLoader) start_loader();
    try {
      pass(lane, prepare, consume);
    } catch (...) {
      loader_.reset();  // stopped mid-pass: the next evaluation starts a pass from its start
      throw;
    }
    ++passes_done_;
  }

 private:
  void pass(const Lane& lane, const std::function<std::vector<at::Tensor>(Batch&)>& prepare,
            const std::function<void(const std::vector<at::Tensor>&)>& consume) {
    std::vector<std::vector<at::Tensor>> parts;
    int64_t rows = 0;
    auto flush = [&] {
      if (parts.empty()) return;
      std::vector<at::Tensor> joined;
      for (size_t f = 0; f < parts[0].size(); ++f) {
        std::vector<at::Tensor> column;
        for (const auto& p : parts) column.push_back(p[f]);
        joined.push_back(column.size() == 1
                             ? column[0]
                             : at::cat(column).contiguous(column[0].suggest_memory_format()));
      }
      parts.clear();
      rows = 0;
      consume(joined);
    };
    const int64_t part = eval_part_size(batch_size_, workers_), n = data_->size();
    for (int64_t b = 0; b < loader_->batches_per_pass(); ++b) {
      Batch batch;
      load_next_batch(*loader_, batch, lane);
      parts.push_back(prepare(batch));
      // The part's place in the pass counts, not what prepare returned: a prepare may keep
      // some rows back for `consume` (those the JPEG engines decode a whole batch at a time).
      rows += std::min(part, n - b * part);
      if (rows >= batch_size_) flush();
    }
    flush();
  }

  void start_loader() {
    loader_.reset();  // its workers have filled every part of its last pass: joins at once
    LoaderOptions lo = eval_loader_options(eval_part_size(batch_size_, workers_), workers_);
    lo.worker_nice = worker_nice_;
    lo.depth = eval_ring_slots(data_->size(), batch_size_, workers_);
    lo.passes = kEvalPassesPerLoader;
    loader_ = std::make_unique<Loader>(data_, lo);
    passes_done_ = 0;
  }

  std::shared_ptr<const Dataset> data_;
  int64_t batch_size_;
  int workers_;
  int worker_nice_;
  std::unique_ptr<Loader> loader_;
  int64_t passes_done_ = 0;
};

/// The training and held-out sides of `d`: every k-th sample (k = 1 / fraction, at least one)
/// held out, so a class-ordered folder is split alike in every class.
inline std::pair<std::shared_ptr<const Dataset>, std::shared_ptr<const Dataset>> split_every_kth(
    std::shared_ptr<const Dataset> d, double fraction) {
  const int64_t n = d->size();
  const int64_t held = std::max<int64_t>(1, static_cast<int64_t>(fraction * n));
  std::vector<int64_t> val_idx = spread(n, held), train_idx;
  std::vector<bool> is_val(static_cast<size_t>(n), false);
  for (int64_t i : val_idx) is_val[static_cast<size_t>(i)] = true;
  for (int64_t i = 0; i < n; ++i)
    if (!is_val[static_cast<size_t>(i)]) train_idx.push_back(i);
  return {std::make_shared<SubsetDataset>(d, train_idx),
          std::make_shared<SubsetDataset>(d, val_idx)};
}

}  // namespace tandem::train::detail
