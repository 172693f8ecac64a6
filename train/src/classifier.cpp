// make_classifier: the datasets, model, optimizer, step and evaluation of an image classifier,
// as a TrainJob (classifier.h).
#include "tandem/train/classifier.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <iostream>

#include "folder_evaluation.h"
#include "job_util.h"
#include "kept_samples.h"
#include "posix_fs.h"
#include "tandem/data/engine_split.h"
#include "tandem/data/idx.h"
#include "tandem/data/image_folder.h"
#include "tandem/detail/autocast.h"
#include "tandem/detail/batch.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/error.h"
#include "tandem/models/folded_resnet.h"
#include "tandem/models/resnet.h"
#include "tandem/models/safetensors.h"
#include "tandem/models/small_cnn.h"
#include "tandem/resized_crop.h"

namespace tandem::train {

using namespace detail;  // job_util.h

namespace {

bool is_file(const std::string& path) { return fs::path_status(path).is_regular_file; }

// The IDX file `stem` in `dir`, gzip-compressed or raw; empty when neither exists.
std::string idx_file(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""})
    if (is_file(dir + "/" + stem + ext)) return dir + "/" + stem + ext;
  return "";
}

}  // namespace

bool is_idx_folder(const std::string& dir) {
  return !idx_file(dir, "train-images-idx3-ubyte").empty();
}

bool is_pairs_folder(const std::string& dir) {
  return fs::is_dir(dir + "/images") && fs::is_dir(dir + "/masks");
}

namespace {

// The IDX job: the small CNN on the folder's gray images, evaluated on its (or --val's) t10k
// files.
void build_idx_job(const ClassifierOptions& o, const std::string& model_name, TrainJob& job) {
  const c10::Device device = o.device;
  const Precision precision = o.precision;
  Workload& w = job.workload;
  TANDEM_CHECK_ARG(model_name == "small_cnn", "model ", model_name,
                   " takes 3-channel images: ", o.data,
                   " holds IDX (28x28 gray) files, expected --model small_cnn");
  TANDEM_CHECK_ARG(!o.freeze_backbone, "--freeze backbone is for the ResNets");
  const std::string images = idx_file(o.data, "train-images-idx3-ubyte");
  const std::string labels = idx_file(o.data, "train-labels-idx1-ubyte");
  TANDEM_CHECK_ARG(!labels.empty(), o.data, " has ", images,
                   " but no train-labels-idx1-ubyte[.gz]");
  auto train_set = std::make_shared<data::IdxDataset>(images, labels);
  const int64_t side = train_set->rows();
  TANDEM_CHECK_ARG(train_set->cols() == side && side % 4 == 0, images, " holds ", train_set->rows(),
                   "x", train_set->cols(),
                   " images: the small CNN expects square ones, a multiple of 4 a side");
  std::shared_ptr<const Dataset> train_data = take(train_set, o.subset);
  // Evaluation: --val (an IDX folder's t10k files, or its train files) or this folder's t10k.
  const std::string val_dir = o.val.empty() ? o.data : o.val;
  std::string val_images = idx_file(val_dir, "t10k-images-idx3-ubyte");
  std::string val_labels = idx_file(val_dir, "t10k-labels-idx1-ubyte");
  if (val_images.empty() && !o.val.empty()) {
    val_images = idx_file(val_dir, "train-images-idx3-ubyte");
    val_labels = idx_file(val_dir, "train-labels-idx1-ubyte");
  }
  int64_t classes = 10;
  for (int64_t i = 0; i < train_set->size(); ++i)
    classes = std::max(classes, train_set->label(i) + 1);

  auto net = models::SmallCnn(models::SmallCnnOptions{1, classes, side});
  if (!o.weights.empty()) load_weights(*net, o.weights);
  net->to(device);
  net->train();
  job.name = "small_cnn on " + o.data;
  job.model = net.ptr();
  w.name = "small_cnn";
  w.data = DataSource::from_dataset(train_data, /*shuffle=*/true, /*drop_last=*/true)
               .with_worker_nice(o.worker_nice);
  // Fashion-MNIST's pixel mean and standard deviation (of x / 255).
  constexpr double kMean = 0.2860, kStd = 0.3530;
  w.feeds.push_back({"normalize",
                     "augment",
                     {"image"},
                     {"x"},
                     [](const Tensors& in) {
                       return Tensors{in[0].to(at::kFloat).div_(255).sub_(kMean).div_(kStd)};
                     },
                     "uint8 -> normalized float",
                     {}});
  auto n = net.ptr();
  w.train.inputs = {"x", "label"};
  w.train.loss = [n, device, precision](const Tensors& in) {
    AutocastScope autocast(device, precision);
    return deterministic_cross_entropy(n->forward(in[0]).to(at::kFloat), in[1]);
  };
  w.train.what = "small CNN, cross-entropy";
  if (!val_images.empty() && !val_labels.empty()) {
    auto val_set = std::make_shared<data::IdxDataset>(val_images, val_labels);
    const std::vector<int64_t> pick =
        spread(val_set->size(), o.val_subset > 0 ? o.val_subset : val_set->size());
    // The test set lives on the device, normalized, from the start: 10 000 images are 31 MB.
    at::Tensor x = at::empty({static_cast<int64_t>(pick.size()), 1, side, side}, at::kByte);
    at::Tensor y = at::empty({static_cast<int64_t>(pick.size())}, at::kLong);
    for (size_t i = 0; i < pick.size(); ++i)
      val_set->get(pick[i], {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]});
    const at::Tensor xv = x.to(device).to(at::kFloat).div_(255).sub_(kMean).div_(kStd);
    const at::Tensor yv = y.to(device);
    job.evaluate = [n, xv, yv, device, precision](const Lane&) {
      at::NoGradGuard no_grad;
      n->eval();
      at::Tensor correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
      at::Tensor loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
      const int64_t N = xv.size(0);
      for (int64_t i = 0; i < N; i += 1000) {
        const int64_t e = std::min(N, i + 1000);
        AutocastScope autocast(device, precision);
        const at::Tensor logits = n->forward(xv.slice(0, i, e)).to(at::kFloat);
        const at::Tensor truth = yv.slice(0, i, e);
        correct += logits.argmax(1).eq(truth).sum();
        loss += at::cross_entropy_loss(logits, truth, {}, at::Reduction::Sum).to(at::kDouble);
      }
      n->train();
      return Evaluation(accuracy_metrics(correct.item<int64_t>(), loss.item<double>(), N), N);
    };
  } else {
    std::cerr << "no t10k-*-idx*-ubyte files in " << val_dir << ": no evaluation\n";
  }
}

// A resumed run keeps the engine split's shares: the positions decoded before the checkpoint
// split as they did, the next ones from the last share on.
void keep_engine_shares(TrainJob& job, const std::shared_ptr<data::EngineShare>& share) {
  job.save_state = [share] {
    nlohmann::json changes = nlohmann::json::array();
    for (const auto& c : share->schedule()) changes.push_back({c.from_position, c.share});
    return nlohmann::json{{"engine_shares", changes}};
  };
  job.load_state = [share](const nlohmann::json& state) {
    if (!state.contains("engine_shares")) return;
    std::vector<data::EngineShare::Change> changes;
    for (const auto& c : state["engine_shares"])
      changes.push_back({c[0].get<uint64_t>(), c[1].get<double>()});
    share->restore(changes);
  };
}

// An image folder's training and held-out sets, and how the evaluation splits its decodes.
struct FolderSets {
  std::shared_ptr<const Dataset> train, val;  // val: null without --val or a held-out split
  int64_t resize_size = 0;                    // Resize's shorter side for evaluation
  data::EngineSplit eval_split;               // the evaluation's own (none without val)
  std::shared_ptr<double> eval_engine_share;  // the share an evaluation turns on, or null
  std::shared_ptr<const KeptSamples> kept;    // val's kept samples, or null (no budget)
};

// The run's note on the evaluation's kept samples: how many of the held-out set, their bytes,
// and how many of them were read ahead while the training ran (`warmer`, where there is one).
std::string kept_samples_note(const KeptSamples& kept, const KeptSamplesWarmer* warmer) {
  if (kept.kept_samples() == 0) return "";  // no evaluation ran, or nothing fit
  const std::string ahead =
      warmer && warmer->read() > 0
          ? ", " + std::to_string(warmer->read()) + " of them read while the training ran"
          : "";
  return "evaluation: " + std::to_string(kept.kept_samples()) + " of " +
         std::to_string(kept.size()) +
         " held-out samples kept in host memory after their first decode (" +
         format_bytes(static_cast<double>(kept.kept_bytes())) + " of a " +
         format_bytes(static_cast<double>(kept.budget_bytes())) + " budget" + ahead +
         "); later evaluations copy them" +
         (kept.kept_samples() < kept.size() ? " and decode the rest" : "");
}

// A quarter of this machine's memory, shared by the ranks a launch runs on it.
int64_t default_eval_cache_bytes() {
  const auto env = distributed::launch_env_from_environment();
  const int local_ranks = env ? std::max(1, env->local_world_size) : 1;
  return static_cast<int64_t>(physical_memory_bytes() / 4 / local_ranks);
}

// Training decodes each sample's random crop only (its box drawn in the worker, before the
// decode: kCropRegion), or without crop_regions the whole image at the scale the crop size
// needs (kDecoded). Evaluation decodes the center crop only (with Resize's scale: kCenterRegion),
// or without crop_regions the whole image at the scale Resize's shorter side needs (S * 256 /
// 224 for S = 224); either way the resize shrinks as torchvision's does.
FolderSets folder_sets(const ClassifierOptions& o,
                       const std::shared_ptr<data::ImageFolderDataset>& folder,
                       const data::ImageFolderOptions& fo, const data::EngineSplit& split) {
  FolderSets sets;
  std::shared_ptr<const Dataset> crops = folder;
  if (o.crop_regions)
    crops = std::make_shared<data::ImageFolderDataset>(
        folder->with_output(data::ImageFolderOutput::kCropRegion)
            .with_engine_share(split.decoder ? split.share : nullptr));
  sets.resize_size = o.image_size * 256 / 224;
  sets.train = crops;
  if (o.val_split > 0) sets.train = split_every_kth(crops, o.val_split).first;
  sets.train = take(sets.train, o.subset);
  if (o.val.empty() && o.val_split <= 0) return sets;
  // The evaluation's images: the center crop's region, or the whole image at Resize's scale.
  auto eval_images = [&](const data::ImageFolderDataset& f) {
    return o.crop_regions ? f.with_output(data::ImageFolderOutput::kCenterRegion)
                                .with_resize_size(sets.resize_size)
                          : f.with_image_size(sets.resize_size);
  };
  data::ImageFolderDataset held_out =
      o.val.empty() ? eval_images(*folder) : eval_images(data::ImageFolderDataset(o.val, fo));
  TANDEM_CHECK_ARG(held_out.classes() == folder->classes(), "--val ", o.val,
                   " has other class folders than --data ", o.data);
  auto held = [&](const data::ImageFolderDataset& d) {
    const auto all = std::make_shared<data::ImageFolderDataset>(d);
    return take(o.val.empty() ? split_every_kth(all, o.val_split).second : all, o.val_subset);
  };
  sets.val = held(held_out);
  // Kept after the first evaluation (their transform draws nothing), up to the budget. Where
  // the whole set fits (by its typical sample), the evaluation decodes on the workers alone:
  // the engines' samples would be kept as their bytes and decoded again at every evaluation.
  const int64_t keep = o.eval_cache_bytes >= 0 ? o.eval_cache_bytes : default_eval_cache_bytes();
  const bool kept_whole =
      keep > 0 && static_cast<double>(sets.val->size()) *
                          static_cast<double>(sample_bytes(sets.val->fields())) <=
                      static_cast<double>(keep);
  if (!kept_whole) {
    // The evaluation splits its decodes as training does, with a decoder of its own (for its
    // thread) and a share of its own (a center crop costs the CPU more than a random one).
    sets.eval_split = data::companion_split(split, o.device, o.workers);
    if (sets.eval_split.share) sets.val = held(held_out.with_engine_share(sets.eval_split.share));
  }
  if (keep > 0) {
    sets.kept = std::make_shared<KeptSamples>(sets.val, keep);
    sets.val = sets.kept;
  }
  const data::EngineSplit& eval_split = sets.eval_split;
  // The evaluation's workers decode ahead while the training runs (EvalPasses: the ring's
  // parts); the engines decode only when the evaluation asks. So, for an adaptive share,
  // the ring fills on the workers alone, and each evaluation turns the engines on for the
  // positions the ring did not hold (from the training's share, then the evaluation's own
  // rates), off again after. A held-out set the ring holds whole never uses them. (A given
  // share splits every position alike, ahead or not: a run that must repeat cannot depend
  // on how far the ring got.)
  if (eval_split.share && eval_split.share->adaptive() && sets.val) {
    const int64_t n = sets.val->size();
    const bool held_whole =
        n <= eval_ring_slots(n, o.batch_size, o.workers) * eval_part_size(o.batch_size, o.workers);
    sets.eval_engine_share = std::make_shared<double>(held_whole ? 0.0 : eval_split.share->share());
    eval_split.share->restore({{0, 0.0}});
  }
  return sets;
}

// The train stage of a ResNet: the whole network, or with --freeze backbone the linear head
// on the frozen backbone's pooled features (a feed stage of its own). Returns the folded
// backbone, or null.
std::shared_ptr<models::FoldedResNet> set_resnet_train_stage(const ClassifierOptions& o,
                                                             const std::string& model_name,
                                                             models::ResNet net, Workload& w) {
  const c10::Device device = o.device;
  const Precision precision = o.precision;
  auto n = net.ptr();
  if (!o.freeze_backbone) {
    net->train();
    w.train.inputs = {"x", "label"};
    w.train.loss = [n, device, precision](const Tensors& in) {
      AutocastScope autocast(device, precision);
      return deterministic_cross_entropy(n->forward(in[0]).to(at::kFloat), in[1]);
    };
    w.train.what = model_name + ", cross-entropy";
    return nullptr;
  }
  net->eval();  // BatchNorm keeps its running statistics
  for (auto& p : net->parameters()) p.set_requires_grad(false);
  for (auto& p : net->fc->parameters()) p.set_requires_grad(true);
  // Batch norm folded into the convolutions, conv + bias (+ add) + ReLU as one cuDNN call on a
  // GPU: no gradient flows into a frozen backbone, so nothing needs the unfused ops. It folds
  // at its first call (after --weights and a resumed checkpoint are loaded).
  auto folded = std::make_shared<models::FoldedResNet>(
      net, models::FoldedResNetOptions{compute_dtype(precision), true});
  w.feeds.push_back(
      {"backbone",
       "backbone",
       {"x"},
       {"features"},
       [folded](const Tensors& in) { return Tensors{folded->features(in[0]).to(at::kFloat)}; },
       "frozen " + model_name + " (batch norm folded) to pooled features",
       {}});
  w.train.inputs = {"features", "label"};
  w.train.loss = [n](const Tensors& in) {
    return deterministic_cross_entropy(n->fc->forward(in[0]), in[1]);
  };
  w.train.what = "linear head, cross-entropy";
  return folded;
}

// The ImageFolder job: a ResNet (its backbone frozen and folded, or trained) on the folder's
// photos, decoded by the loader's workers (and the JPEG engines with decode auto), evaluated
// on --val or a held-out split.
void build_image_folder_job(const ClassifierOptions& o, const std::string& model_name,
                            TrainJob& job) {
  const c10::Device device = o.device;
  Workload& w = job.workload;
  TANDEM_CHECK_ARG(model_name != "small_cnn", "model small_cnn takes 28x28 IDX images: ", o.data,
                   " is an image folder, expected a ResNet (resnet18/34/50)");
  data::ImageFolderOptions fo;
  fo.image_size = o.image_size;
  fo.output = data::ImageFolderOutput::kDecoded;
  auto folder = std::make_shared<data::ImageFolderDataset>(o.data, fo);
  // decode auto: the JPEG engines beside the workers (no decoder: the workers alone).
  data::EngineSplit split;
  if (o.crop_regions && o.decode == "auto")
    split = data::open_engine_split(*folder, device, o.image_size, o.engine_share, o.workers,
                                    "--decode auto");
  if (split.decoder) {
    job.config["decode"] = "auto";  // absent: the CPU workers alone (older runs too)
    if (!split.share->adaptive()) job.config["engine_share"] = split.share->share();
    keep_engine_shares(job, split.share);
  }
  const FolderSets sets = folder_sets(o, folder, fo, split);
  const int64_t classes = static_cast<int64_t>(folder->classes().size());

  models::ResNet net = models::resnet(model_name, models::ResNetOptions{classes});
  if (!o.weights.empty()) load_weights(*net, o.weights);
  net->to(device);
  const bool nhwc = o.channels_last;
  if (nhwc) models::to_channels_last(*net);
  job.name = model_name + (o.freeze_backbone ? " (frozen backbone)" : "") + " on " + o.data;
  job.model = net.ptr();
  w.name = model_name;
  w.data = DataSource::from_dataset(sets.train, /*shuffle=*/true, /*drop_last=*/true)
               .with_worker_nice(o.worker_nice);
  const int64_t S = o.image_size;
  if (split.decoder)
    w.feeds =
        data::engine_split_feeds(ResizedCropSpec::train(S), split, device, nhwc, o.batch_size);
  else
    w.feeds.push_back(o.crop_regions ? given_crop_feed(ResizedCropSpec::train(S), nhwc)
                                     : resized_crop_feed(ResizedCropSpec::train(S),
                                                         seeded_generator(device, o.seed), nhwc));
  const std::shared_ptr<models::FoldedResNet> folded =
      set_resnet_train_stage(o, model_name, net, w);
  if (!sets.val) return;
  FolderEvaluationSetup e;
  e.model = net.ptr();
  e.folded = folded;
  e.data = sets.val;
  e.spec = ResizedCropSpec::eval(S, sets.resize_size);
  e.split = sets.eval_split;
  e.engine_share = sets.eval_engine_share;
  e.device = device;
  e.precision = o.precision;
  e.channels_last = nhwc;
  e.batch_size = o.batch_size;
  e.workers = o.workers;
  e.worker_nice = o.worker_nice;
  e.seed = o.seed;
  FolderEvaluation evaluation = folder_evaluation(std::move(e));
  job.evaluate = std::move(evaluation.evaluate);
  job.prepare_evaluation = std::move(evaluation.prepare);
  // The held-out samples past the ring, read into the kept samples while the training runs,
  // where the whole set is kept on the workers alone (the same pixels whoever decodes them).
  std::shared_ptr<KeptSamplesWarmer> warmer;
  if (sets.kept && !sets.eval_split.share) {
    const int64_t n = sets.kept->size();
    const int64_t ahead =
        eval_ring_slots(n, o.batch_size, o.workers) * eval_part_size(o.batch_size, o.workers);
    if (ahead < n)
      warmer = std::make_shared<KeptSamplesWarmer>(sets.kept, ahead, std::max(1, o.workers / 2));
  }
  if (sets.kept)
    job.report = [kept = sets.kept, warmer] { return kept_samples_note(*kept, warmer.get()); };
}

}  // namespace

TrainJob make_classifier(const ClassifierOptions& given) {
  const ClassifierOptions o = with_loader_workers(given);
  TANDEM_CHECK_ARG(!o.data.empty(),
                   "no training data: expected --data DIR (IDX files or an "
                   "ImageFolder)");
  const fs::PathStatus data = fs::path_status(o.data);
  TANDEM_CHECK_ARG(data.exists, "--data ", o.data, " does not exist");
  TANDEM_CHECK_ARG(data.is_directory, "--data ", o.data,
                   " is a file: expected a folder (IDX files or one subfolder per class)");
  TANDEM_CHECK_ARG(o.val_split >= 0 && o.val_split < 1, "validation split ", o.val_split,
                   " is not valid: expected a fraction in [0, 1)");
  TANDEM_CHECK_ARG(o.optimizer == "sgd" || o.optimizer == "adamw", "optimizer '", o.optimizer,
                   "' is not valid: expected sgd or adamw");
  TANDEM_CHECK_ARG(o.subset >= 0 && o.val_subset >= 0, "subset sizes must be >= 0");
  if (is_pairs_folder(o.data)) return make_segmenter(o);
  const bool idx = is_idx_folder(o.data);
  const std::string model_name = o.model == "auto" ? (idx ? "small_cnn" : "resnet18") : o.model;
  TANDEM_CHECK_ARG(model_name == "small_cnn" || model_name == "resnet18" ||
                       model_name == "resnet34" || model_name == "resnet50",
                   "model '", o.model,
                   "' is not valid: expected small_cnn, resnet18, resnet34, resnet50 or auto");
  const bool adamw = o.optimizer == "adamw";
  const double lr = o.lr >= 0 ? o.lr : (adamw ? 1e-3 : 0.1);
  const double wd = o.weight_decay >= 0 ? o.weight_decay : (adamw ? 1e-2 : 5e-4);
  TANDEM_CHECK_ARG(lr > 0, "learning rate ", lr, " is not valid: expected > 0");

  TrainJob job;
  job.built_for_batch_size = o.batch_size;
  job.built_for_workers = o.workers;
  job.config = common_config(o, model_name, lr, wd);
  job.config.update(
      {{"freeze_backbone", o.freeze_backbone}, {"channels_last", o.channels_last && !idx}});
  if (!idx) job.config["image_size"] = o.image_size;
  if (!idx && o.crop_regions) job.config["crop"] = "region";  // absent: whole (older runs too)
  TANDEM_CHECK_ARG(o.decode == "cpu" || o.decode == "auto", "decode '", o.decode,
                   "' is not valid: expected cpu or auto");
  TANDEM_CHECK_ARG(o.engine_share <= 1, "engine share ", o.engine_share,
                   " is not valid: expected 0 to 1 (or < 0: measured)");
  check_worker_nice(o.worker_nice);
  torch::manual_seed(o.seed);
  Workload& w = job.workload;
  w.device = o.device;
  if (idx)
    build_idx_job(o, model_name, job);
  else
    build_image_folder_job(o, model_name, job);
  auto params = trainable(*job.model);
  if (adamw)
    w.train.optimizer = std::make_shared<optim::Adam>(params, optim::AdamOptions::adamw(lr, wd));
  else
    w.train.optimizer =
        std::make_shared<optim::Sgd>(params, optim::SgdOptions{lr, o.momentum, 0, false, wd});
  if (needs_loss_scale(o.precision)) w.train.loss_scale = std::make_shared<LossScale>(o.device);
  return job;
}

}  // namespace tandem::train
