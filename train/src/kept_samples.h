// KeptSamples: a dataset whose samples are kept in host memory after their first read, up to a
// byte budget, so that every later pass over it copies them instead of decoding them again.
//
// Why: an evaluation's transform draws nothing (Resize + CenterCrop), so a held-out photo
// decodes to the same pixels at every evaluation of a run. On large photos the decode is the
// evaluation's bound (1000-2000 px photos: ~4,000 img/s from every core and the JPEG engines,
// where the same run trains at ~5,800 and the forward alone runs above 20,000), and a held-out
// set of a few thousand photos is a few hundred MB of decoded center crops.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/detail/thread_name.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/loader.h"

namespace tandem::train::detail {

class KeptSamples : public Dataset {
 public:
  /// Keeps `base`'s samples up to `budget_bytes` of their tensors (the first ones read; those
  /// past the budget are read from `base` every time). `base` must give the same sample for
  /// an index whatever the draw: a sample is kept as its first read made it (an engine split's
  /// side included).
  KeptSamples(std::shared_ptr<const Dataset> base, int64_t budget_bytes)
      : base_(std::move(base)),
        fields_(base_->fields()),
        budget_(budget_bytes),
        kept_(static_cast<size_t>(base_->size())) {}

  int64_t size() const override { return base_->size(); }
  std::vector<FieldSpec> fields() const override { return fields_; }
  void get_sample(int64_t index, std::vector<at::Tensor>& out) const override {
    if (replay(index, out)) return;
    base_->get_sample(index, out);
    keep(index, out);
  }
  void get_drawn_sample(int64_t index, const SampleDraw& draw,
                        std::vector<at::Tensor>& out) const override {
    if (replay(index, out)) return;
    base_->get_drawn_sample(index, draw, out);
    keep(index, out);
  }
  std::string sample_source(int64_t index) const override { return base_->sample_source(index); }

  /// Bytes kept so far, of the budget.
  int64_t kept_bytes() const { return used_.load(); }
  int64_t budget_bytes() const { return budget_; }
  /// Samples kept so far.
  int64_t kept_samples() const { return count_.load(); }

 private:
  using Sample = std::vector<at::Tensor>;

  std::shared_ptr<const Sample> find(int64_t index) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return index >= 0 && index < size() ? kept_[static_cast<size_t>(index)] : nullptr;
  }

  // A kept sample into `out`: a variable-size field's tensor handed over as it is (the loader
  // only copies it into its slot), a fixed-size one copied into its slot view.
  bool replay(int64_t index, std::vector<at::Tensor>& out) const {
    const std::shared_ptr<const Sample> s = find(index);
    if (!s) return false;
    for (size_t f = 0; f < fields_.size(); ++f) {
      if (fields_[f].variable_size)
        out[f] = (*s)[f];
      else
        out[f].copy_((*s)[f]);
    }
    return true;
  }

  void keep(int64_t index, const std::vector<at::Tensor>& out) const {
    int64_t bytes = 0;  // what keeping costs: a variable-size tensor's whole storage
    for (size_t f = 0; f < fields_.size(); ++f)
      bytes += static_cast<int64_t>(fields_[f].variable_size ? out[f].storage().nbytes()
                                                             : out[f].nbytes());
    if (used_.fetch_add(bytes) + bytes > budget_) {  // over the budget: not kept
      used_.fetch_sub(bytes);
      return;
    }
    auto s = std::make_shared<Sample>();
    for (size_t f = 0; f < fields_.size(); ++f)  // a slot view is overwritten by the next batch
      s->push_back(fields_[f].variable_size ? out[f] : out[f].clone());
    const std::lock_guard<std::mutex> lock(mutex_);
    if (kept_[static_cast<size_t>(index)]) {  // kept by another worker meanwhile
      used_.fetch_sub(bytes);
    } else {
      kept_[static_cast<size_t>(index)] = std::move(s);
      count_.fetch_add(1);
    }
  }

  std::shared_ptr<const Dataset> base_;
  std::vector<FieldSpec> fields_;
  int64_t budget_;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const Sample>> kept_;
  mutable std::atomic<int64_t> used_{0};
  mutable std::atomic<int64_t> count_{0};
};

/// Reads a KeptSamples' samples from `first` on into it, on background threads at the lowest
/// priority, while the run trains: the held-out samples past what the evaluation's ring decodes
/// ahead, which the first evaluation would otherwise decode while it waits (the later ones copy
/// them). Why: a held-out folder larger than the ring ran its first evaluation at the decode's
/// rate, under half the later ones' (2,000 photos of 320-640 px, ResNet-18: 0.48 of them), though
/// the training left cores idle for most of the epoch before it. At nice 19 the threads take
/// only cores the run's own threads leave.
/// Stops when every sample from `first` has been read, the budget is full, or on destruction
/// (joins: a sample being read is finished). A sample that fails to load is left to the
/// evaluation, which reports or skips it by its own rules. Only for a dataset whose samples do
/// not depend on the loader's draw (an evaluation's centre crops with no engine split: the same
/// pixels whoever reads them).
class KeptSamplesWarmer {
 public:
  KeptSamplesWarmer(std::shared_ptr<const KeptSamples> kept, int64_t first, int threads)
      : kept_(std::move(kept)), next_(std::max<int64_t>(0, first)) {
    for (int t = 0; t < std::max(1, threads); ++t) threads_.emplace_back([this] { work(); });
  }
  ~KeptSamplesWarmer() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  KeptSamplesWarmer(const KeptSamplesWarmer&) = delete;
  KeptSamplesWarmer& operator=(const KeptSamplesWarmer&) = delete;

  /// Samples these threads have read so far (kept, or found kept already).
  int64_t read() const { return read_.load(); }

 private:
  void work() {
    name_this_thread("eval warm");
    (void)lower_this_thread_priority(kMaxNice);  // best effort: at worst it shares the cores
    const std::vector<FieldSpec> fields = kept_->fields();
    const int64_t typical = sample_bytes(fields);
    // As the loader's workers hand them over: a fixed-size field's tensor to write into (one,
    // reused: keeping a sample clones it), a variable-size one's undefined for the dataset to set.
    std::vector<at::Tensor> out(fields.size());
    for (size_t f = 0; f < fields.size(); ++f)
      if (!fields[f].variable_size) out[f] = at::empty(fields[f].shape, fields[f].dtype);
    while (!stop_) {
      if (kept_->kept_bytes() + typical > kept_->budget_bytes()) return;  // nothing more fits
      const int64_t index = next_.fetch_add(1);
      if (index >= kept_->size()) return;
      for (size_t f = 0; f < fields.size(); ++f)
        if (fields[f].variable_size) out[f] = at::Tensor();
      try {
        kept_->get_sample(index, out);
        read_.fetch_add(1);
      } catch (const std::exception&) {  // the evaluation meets it again and says so
      }
    }
  }

  std::shared_ptr<const KeptSamples> kept_;
  std::atomic<int64_t> next_;
  std::atomic<int64_t> read_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;  // last: started once the rest is set
};

}  // namespace tandem::train::detail
