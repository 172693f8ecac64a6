// make_segmenter: semantic segmentation from image + mask pairs, as a TrainJob (classifier.h):
// an FCN head over a ResNet, pixel cross-entropy that skips ignore_index, mIoU evaluation.
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/utils.h>

#include "job_util.h"
#include "tandem/data/image_mask_pairs.h"
#include "tandem/detail/autocast.h"
#include "tandem/detail/batch.h"
#include "tandem/error.h"
#include "tandem/models/fcn.h"
#include "tandem/train/classifier.h"

namespace tandem::train {

using namespace detail;  // job_util.h

namespace {

// ImageNet's channel statistics, as torchvision's segmentation references normalize.
constexpr double kMean[3] = {0.485, 0.456, 0.406}, kStd[3] = {0.229, 0.224, 0.225};

// (B, 3, S, S) uint8 -> normalized float on the current stream. `mean` and `std` are
// (1, 3, 1, 1) float on the image's device, in 0..255 units, made once: a graph captures this
// stage, and a host-to-device copy of the constants would not be capturable.
at::Tensor normalize(const at::Tensor& image, const at::Tensor& mean, const at::Tensor& std,
                     bool channels_last) {
  at::Tensor x = (image.to(at::kFloat) - mean) / std;
  return channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
}

// Mean pixel cross-entropy over the pixels whose id is not `ignore`: per-pixel losses, then a
// sum over a count (deterministic on CUDA, unlike the fused mean of nll_loss2d).
at::Tensor pixel_cross_entropy(const at::Tensor& logits, const at::Tensor& mask, int64_t ignore) {
  const at::Tensor per_pixel =
      at::cross_entropy_loss(logits, mask, {}, at::Reduction::None, ignore);
  const at::Tensor valid = mask.ne(ignore).sum().clamp_min(1).to(at::kFloat);
  return per_pixel.sum() / valid;
}

// The training and held-out pairs: --val's folder, or every k-th pair held out (--val-split),
// each cut to --subset / --val-subset.
std::pair<std::shared_ptr<const Dataset>, std::shared_ptr<const Dataset>> pair_sets(
    const ClassifierOptions& o, const data::ImageMaskPairsOptions& po) {
  auto pairs = std::make_shared<data::ImageMaskPairs>(o.data, po);
  std::shared_ptr<const Dataset> train_data = pairs, val_data;
  if (!o.val.empty()) {
    TANDEM_CHECK_ARG(is_pairs_folder(o.val), "--val ", o.val,
                     " is not a segmentation folder: expected images/ and masks/ in it");
    val_data = std::make_shared<data::ImageMaskPairs>(o.val, po);
  } else if (o.val_split > 0) {
    std::tie(train_data, val_data) = split_every_kth(pairs, o.val_split);
  }
  train_data = take(train_data, o.subset);
  if (val_data) val_data = take(val_data, o.val_subset);
  return {train_data, val_data};
}

// mIoU (over the classes present in the labels or the predictions), pixel accuracy and the mean
// pixel loss from a pass's K x K confusion counts (label-major), its loss sum and pixel count.
Metrics segmentation_metrics(const at::Tensor& confusion, int64_t K, const at::Tensor& loss_sum,
                             const at::Tensor& pixels) {
  const at::Tensor cm = confusion.view({K, K}).to(at::kCPU).to(at::kDouble);
  const at::Tensor tp = cm.diag(), unions = cm.sum(0) + cm.sum(1) - tp;
  const at::Tensor present = unions.gt(0);
  const double miou = present.any().item<bool>()
                          ? (tp / unions.clamp_min(1)).masked_select(present).mean().item<double>()
                          : 0;
  const int64_t count = pixels.item<int64_t>();
  return Metrics{{"miou", miou},
                 {"pixel_accuracy", count > 0 ? tp.sum().item<double>() / count : 0},
                 {"val_loss", count > 0 ? loss_sum.item<double>() / count : 0}};
}

// What the evaluation of a segmenter needs besides its pairs.
struct SegmentationEval {
  std::shared_ptr<models::FcnResNetImpl> net;
  int64_t classes = 0, ignore = 0;
  c10::Device device = c10::kCPU;
  Precision precision = Precision::kFp32;
  at::Tensor mean, std;  // normalize()'s
  bool channels_last = false;
};

// The job's evaluate function: one pass over `val_data` per call, the network in eval mode.
std::function<Evaluation(const Lane&)> segmentation_evaluation(
    const SegmentationEval& e, std::shared_ptr<const Dataset> val_data, int64_t batch_size,
    int workers, int worker_nice) {
  auto passes = std::make_shared<EvalPasses>(std::move(val_data), batch_size, workers, worker_nice);
  return [e, passes, batch_size](const Lane& lane) {
    const int64_t K = e.classes;
    at::NoGradGuard no_grad;
    e.net->eval();
    // confusion[label * K + prediction], over the pixels that are not ignored
    const auto longs = at::TensorOptions().dtype(at::kLong).device(e.device);
    at::Tensor confusion = at::zeros({K * K}, longs);
    at::Tensor loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(e.device));
    at::Tensor pixels = at::zeros({}, longs);
    int64_t images = 0;
    passes->run(
        lane,
        [&](Batch& batch) {
          return std::vector<at::Tensor>{
              normalize(batch.get("image"), e.mean, e.std, e.channels_last), batch.get("mask")};
        },
        [&](const std::vector<at::Tensor>& xm) {
          const at::Tensor& mask = xm[1];
          images += mask.size(0);
          AutocastScope autocast(e.device, e.precision);
          // A pass's short last batch at the batch size on CUDA (job_util.h: no new shapes to
          // tune), its padding's logits dropped.
          const at::Tensor logits =
              e.net->forward(padded_to_the_batch_size(xm[0], batch_size, e.device.is_cuda()))
                  .narrow(0, 0, mask.size(0))
                  .to(at::kFloat);
          const at::Tensor valid = mask.ne(e.ignore);
          const at::Tensor pred = logits.argmax(1);
          confusion +=
              at::bincount((mask.masked_select(valid) * K + pred.masked_select(valid)), {}, K * K);
          loss += at::cross_entropy_loss(logits, mask, {}, at::Reduction::Sum, e.ignore)
                      .to(at::kDouble);
          pixels += valid.sum();
        });
    e.net->train();
    return Evaluation(segmentation_metrics(confusion, K, loss, pixels), images);
  };
}

}  // namespace

TrainJob make_segmenter(const ClassifierOptions& given) {
  const ClassifierOptions o = with_loader_workers(given);
  TANDEM_CHECK_ARG(o.classes >= 1, "segmentation data ", o.data,
                   ": give the class count, --classes N (mask ids 0 .. N-1; --ignore-index ",
                   o.ignore_index, " is skipped)");
  const std::string model_name = o.model == "auto" ? "fcn_resnet18" : o.model;
  TANDEM_CHECK_ARG(model_name.rfind("fcn_", 0) == 0, "model '", model_name,
                   "' classifies: ", o.data,
                   " holds image + mask pairs, expected fcn_resnet18, fcn_resnet34 or "
                   "fcn_resnet50");
  TANDEM_CHECK_ARG(!o.freeze_backbone, "--freeze backbone is for the classifiers");
  check_worker_nice(o.worker_nice);
  const bool adamw = o.optimizer == "adamw";
  const double lr = o.lr >= 0 ? o.lr : (adamw ? 1e-3 : 0.01);
  const double wd = o.weight_decay >= 0 ? o.weight_decay : (adamw ? 1e-2 : 1e-4);
  const c10::Device device = o.device;
  const Precision precision = o.precision;
  const bool nhwc = o.channels_last;
  const int64_t ignore = o.ignore_index;

  data::ImageMaskPairsOptions po;
  po.image_size = o.image_size;
  po.classes = o.classes;
  po.ignore_index = ignore;
  const auto [train_data, val_data] = pair_sets(o, po);

  TrainJob job;
  job.built_for_batch_size = o.batch_size;
  job.built_for_workers = o.workers;
  job.config = common_config(o, model_name, lr, wd);
  job.config.update({{"classes", o.classes},
                     {"ignore_index", ignore},
                     {"image_size", o.image_size},
                     {"channels_last", nhwc}});
  torch::manual_seed(o.seed);
  models::FcnOptions fo;
  fo.backbone = model_name.substr(4);
  fo.num_classes = o.classes;
  auto net = models::FcnResNet(fo);
  // A classification checkpoint of the ResNet (torchvision's names) starts the backbone.
  if (!o.weights.empty()) load_weights(*net->backbone, o.weights);
  for (auto& p : net->backbone->fc->parameters()) p.set_requires_grad(false);  // unused
  net->to(device);
  if (nhwc) models::to_channels_last(*net);
  net->train();
  job.name = model_name + " on " + o.data;
  job.model = net.ptr();

  const auto on_device = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor mean = at::tensor({kMean[0], kMean[1], kMean[2]}, at::kDouble)
                              .mul(255)
                              .to(on_device)
                              .view({1, 3, 1, 1});
  const at::Tensor std = at::tensor({kStd[0], kStd[1], kStd[2]}, at::kDouble)
                             .mul(255)
                             .to(on_device)
                             .view({1, 3, 1, 1});
  Workload& w = job.workload;
  w.name = model_name;
  w.device = device;
  w.data = DataSource::from_dataset(train_data, /*shuffle=*/true, /*drop_last=*/true)
               .with_worker_nice(o.worker_nice);
  w.feeds.push_back(
      {"normalize",
       "augment",
       {"image"},
       {"x"},
       [mean, std, nhwc](const Tensors& in) { return Tensors{normalize(in[0], mean, std, nhwc)}; },
       "uint8 -> normalized float",
       {}});
  auto n = net.ptr();
  w.train.inputs = {"x", "mask"};
  w.train.loss = [n, device, precision, ignore](const Tensors& in) {
    AutocastScope autocast(device, precision);
    return pixel_cross_entropy(n->forward(in[0]).to(at::kFloat), in[1], ignore);
  };
  w.train.what = model_name + ", pixel cross-entropy";
  auto params = trainable(*net);
  if (adamw)
    w.train.optimizer = std::make_shared<optim::Adam>(params, optim::AdamOptions::adamw(lr, wd));
  else
    w.train.optimizer =
        std::make_shared<optim::Sgd>(params, optim::SgdOptions{lr, o.momentum, 0, false, wd});
  if (needs_loss_scale(precision)) w.train.loss_scale = std::make_shared<LossScale>(device);

  if (val_data) {
    SegmentationEval e;
    e.net = n;
    e.classes = o.classes;
    e.ignore = ignore;
    e.device = device;
    e.precision = precision;
    e.mean = mean;
    e.std = std;
    e.channels_last = nhwc;
    job.evaluate = segmentation_evaluation(e, val_data, o.batch_size, o.workers, o.worker_nice);
  }
  return job;
}

}  // namespace tandem::train
