// folder_evaluation: one evaluation pass of the image-folder classifier (folder_evaluation.h).
#include "folder_evaluation.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <utility>
#include <vector>

#include "engine_crops_ahead.h"
#include "job_util.h"
#include "tandem/detail/batch.h"

namespace tandem::train::detail {

namespace {

// One pass: the loader's parts cropped as they come, each batch forwarded once whole. With
// engines, a batch's engine rows decode (EngineCropsAhead) while the next batch's parts load:
// the batch waits, and is forwarded when the next one is in, its engine crops joined.
class Scoring {
 public:
  Scoring(const FolderEvaluationSetup& s, EngineCropsAhead* ahead, const at::Generator& gen,
          const Lane& lane)
      : s_(s),
        ahead_(ahead),
        gen_(gen),
        lane_(lane),
        correct_(at::zeros({}, at::TensorOptions().dtype(at::kLong).device(s.device))),
        loss_(at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(s.device))) {}

  /// A loader part: its workers' rows cropped (x, label); its engine rows kept for the batch's
  /// one decode (the engines lose much of their rate on a part's few images).
  std::vector<at::Tensor> part(Batch& batch) {
    const data::SplitRows r =
        s_.split.decoder ? data::split_rows(batch.get("jpeg"), batch.get(offsets_field("jpeg")),
                                            batch.get(sizes_field("jpeg")))
                         : data::SplitRows{};
    if (r.engines.empty())  // every row decoded by the workers
      return {crop(batch, at::Tensor()), batch.get("label")};
    const at::Tensor label = batch.get("label");
    held_bytes_.push_back(batch.get("jpeg"));  // the bytes `encoded_` points into
    encoded_.insert(encoded_.end(), r.encoded.begin(), r.encoded.end());
    held_labels_.push_back(label.index_select(0, data::host_to_device(r.engines, s_.device)));
    const at::Tensor rows = data::host_to_device(r.cpu, s_.device);
    if (r.cpu.empty())  // every row on the engines: nothing to crop now
      return {layout(at::empty({0, 3, s_.spec.out_h, s_.spec.out_w},
                               at::TensorOptions().dtype(at::kFloat).device(s_.device))),
              label.index_select(0, rows)};
    return {crop(batch, rows), label.index_select(0, rows)};
  }

  /// A whole batch's workers' rows: forwarded now when the engines have none of it, else after
  /// the next batch's parts.
  void batch(std::vector<at::Tensor> xy) {
    if (encoded_.empty()) {  // none on the engines: forward it in order
      forward_waiting({});
      forward(xy);
      return;
    }
    const at::Tensor labels = at::cat(held_labels_);
    held_labels_.clear();
    forward_waiting(std::move(encoded_));
    encoded_.clear();
    waiting_ = std::move(xy);
    waiting_labels_ = labels;
  }

  /// Forwards the batch still waiting on its engine crops, if any.
  void finish() { forward_waiting({}); }

  /// The pass's kernels once, on stand-ins: one black 16 x 16 image's box drawn and cropped,
  /// then forwarded and scored as a short last batch (padded to the batch size: the shapes the
  /// training tuned). Counts into this Scoring, which the caller drops.
  void rehearse() {
    const auto on_device = [&](at::ScalarType t) {
      return at::TensorOptions().dtype(t).device(s_.device);
    };
    const int64_t side = 16, channels = static_cast<int64_t>(s_.spec.mean.size());
    const at::Tensor sizes_here =
        at::tensor({side, side, channels}, on_device(at::kLong)).view({1, 3});
    const at::Tensor boxes = draw_crop_boxes(s_.spec, sizes_here, gen_);
    const at::Tensor x =
        layout(resized_crop(at::zeros({side * side * channels}, on_device(at::kByte)),
                            at::zeros({1}, on_device(at::kLong)), sizes_here, boxes, s_.spec));
    forward({x, at::zeros({1}, on_device(at::kLong))});
  }

  Evaluation result() const {
    return Evaluation(accuracy_metrics(correct_.item<int64_t>(), loss_.item<double>(), seen_),
                      seen_);
  }

 private:
  at::Tensor layout(const at::Tensor& x) const {
    return s_.channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
  }

  // Resize + CenterCrop on the device of a part's `rows` (all where undefined): by the boxes
  // the workers decoded the center crops for, or drawn for the whole images.
  at::Tensor crop(const Batch& batch, const at::Tensor& rows) const {
    const bool given = batch.has("crop_box");
    at::Tensor offsets = batch.get(offsets_field("image")), sizes = batch.get(sizes_field("image")),
               boxes = given ? batch.get("crop_box") : at::Tensor();
    if (rows.defined()) {
      offsets = offsets.index_select(0, rows);
      sizes = sizes.index_select(0, rows);
      if (given) boxes = boxes.index_select(0, rows);
    }
    if (!given) boxes = draw_crop_boxes(s_.spec, sizes, gen_);
    return layout(resized_crop(batch.get("image"), offsets, sizes, boxes, s_.spec));
  }

  void forward(const std::vector<at::Tensor>& xy) {
    AutocastScope autocast(s_.device, s_.precision);
    // A pass's short last batch at the batch size on CUDA (job_util.h: no new shapes to tune).
    const at::Tensor x = padded_to_the_batch_size(xy[0], s_.batch_size, s_.device.is_cuda());
    // A frozen backbone evaluates as it trains: folded (the module's features within float
    // rounding, without its batch-norm and ReLU passes).
    const at::Tensor logits =
        (s_.folded ? s_.model->fc->forward(s_.folded->features(x).to(at::kFloat))
                   : s_.model->forward(x))
            .narrow(0, 0, xy[0].size(0))
            .to(at::kFloat);
    correct_ += logits.argmax(1).eq(xy[1]).sum();
    loss_ += at::cross_entropy_loss(logits, xy[1], {}, at::Reduction::Sum).to(at::kDouble);
    seen_ += xy[1].size(0);
  }

  // Takes the waiting batch's engine crops (their decode done) and forwards the batch; `next`
  // (may be empty) starts on the engines first, so they never idle on a forward.
  void forward_waiting(std::vector<data::EncodedImage> next) {
    at::Tensor engine_x;
    if (!waiting_.empty()) engine_x = ahead_->finish(lane_);
    if (!next.empty()) ahead_->start(std::move(next), std::move(held_bytes_));
    held_bytes_.clear();
    if (waiting_.empty()) return;
    // (cat of a part the engines took whole, with no rows, may not keep channels-last)
    forward({layout(at::cat({waiting_[0], layout(engine_x)})),
             at::cat({waiting_[1], waiting_labels_})});
    waiting_.clear();
  }

  const FolderEvaluationSetup& s_;
  EngineCropsAhead* ahead_;
  const at::Generator& gen_;
  const Lane& lane_;
  at::Tensor correct_, loss_;
  int64_t seen_ = 0;
  // Split: the engine rows kept for one decode per batch; the host tensors hold the bytes
  // `encoded_` points into.
  std::vector<at::Tensor> held_bytes_, held_labels_;
  std::vector<data::EncodedImage> encoded_;
  // The batch whose engine rows are decoding: its workers' rows (x, label) and the engine
  // rows' labels, joined and forwarded once the next batch's parts are in.
  std::vector<at::Tensor> waiting_;
  at::Tensor waiting_labels_;
};

// The engines on for the positions the ring has not decoded, off for the next pass's (the
// share the evaluation ended with kept for the next one), even if it throws.
struct EnginesOn {
  data::EngineShare* share;
  double* value;
  EnginesOn(data::EngineShare* s, double* v) : share(v && *v > 0 ? s : nullptr), value(v) {
    if (share) share->set(*value);
  }
  ~EnginesOn() {
    if (!share) return;
    *value = share->share();
    share->set(0);
  }
};

// An evaluation stopped by an error leaves no decode behind for the next one.
struct DropPending {
  EngineCropsAhead* a;
  ~DropPending() {
    if (a) a->drop();
  }
};

}  // namespace

FolderEvaluation folder_evaluation(FolderEvaluationSetup setup) {
  const at::Generator gen = seeded_generator(setup.device, setup.seed);  // draws no randomness
  auto passes =
      std::make_shared<EvalPasses>(setup.data, setup.batch_size, setup.workers, setup.worker_nice);
  // The engines' rows of each batch decode on a thread of their own while the next batch's
  // parts load (EngineCropsAhead); made once, for every evaluation of the run.
  std::shared_ptr<EngineCropsAhead> ahead;
  if (setup.split.decoder)
    ahead =
        std::make_shared<EngineCropsAhead>(setup.spec, setup.split, setup.device, setup.batch_size);
  auto s = std::make_shared<const FolderEvaluationSetup>(std::move(setup));
  FolderEvaluation e;
  e.evaluate = [s, gen, passes, ahead](const Lane& lane) {
    at::NoGradGuard no_grad;
    s->model->eval();
    EnginesOn engines_on(s->split.share.get(), s->engine_share.get());
    DropPending drop_pending{ahead.get()};
    Scoring scoring(*s, ahead.get(), gen, lane);
    passes->run(
        lane, [&](Batch& batch) { return scoring.part(batch); },
        [&](std::vector<at::Tensor> xy) { scoring.batch(std::move(xy)); });
    scoring.finish();
    if (!s->folded) s->model->train();
    return scoring.result();
  };
  if (!s->device.is_cuda()) return e;
  e.prepare = [s](const Lane& lane) {
    at::NoGradGuard no_grad;
    s->model->eval();
    // A generator of its own: the box of the eval transform draws nothing random, but the draw
    // advances its generator's offset, and the evaluations' generator stays untouched.
    const at::Generator stand_in_gen = seeded_generator(s->device, s->seed);
    Scoring scoring(*s, nullptr, stand_in_gen, lane);
    scoring.rehearse();
    if (!s->folded) s->model->train();
  };
  return e;
}

}  // namespace tandem::train::detail
