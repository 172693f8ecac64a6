// Workload "images": ImageFolder files -> decode in the loader -> resized crop on the GPU ->
// ResNet. See images.h.
#include "tandem/workloads/images.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>

#include "tandem/data/decode.h"
#include "tandem/data/engine_split.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/nvjpeg_decoder.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"
#include "tandem/models/folded_resnet.h"
#include "tandem/models/resnet.h"
#include "tandem/optim.h"
#include "tandem/resized_crop.h"
#include "tandem/workloads/registry.h"

namespace tandem {

namespace {
const std::vector<WorkloadParam>& images_params() {
  static const std::vector<WorkloadParam> params{
      {"model",
       "r50_frozen_head (a frozen ResNet-50 backbone on its own lane, a linear head trained), "
       "r18_full or r50_full (a whole ResNet-18 / ResNet-50 trained)",
       {"r50_frozen_head", "r18_full", "r50_full"}},
      {"backbone",
       "how r50_frozen_head runs its frozen backbone: folded (batch norm folded into the "
       "convolutions, conv + bias (+ add) + ReLU as one cuDNN call) or module (the ResNet "
       "module in eval mode)",
       {"folded", "module"}},
      {"bn",
       "how r18_full and r50_full run batch norm in training: fused (tandem's kernels: batch "
       "norm with the ReLU and residual add after it, and the stem's max pool) or module "
       "(LibTorch's BatchNorm2d, add, ReLU and max pool one after another)",
       {"fused", "module"}},
      {"weight_casts",
       "with bn=fused and precision=bf16: together (every convolution's weight cast to bf16 a "
       "layer at a time, one launch a layer and one for its gradients) or autocast (autocast's "
       "own casts, two launches a convolution); the same values",
       {"together", "autocast"}},
      {"bn_stats",
       "with bn=fused, weight_casts=together and precision=fp16: conv (each convolution before "
       "a batch norm gives its output's sums from its own epilogue, one cuDNN graph, and the "
       "batch norm does not read the activation for its statistics; where cuDNN has no such "
       "graph the convolution runs plain) or pass (the batch norm's own pass over its input)",
       {"conv", "pass"}},
      {"convs",
       "with bn=fused and weight_casts=together: plans (each shape's cuDNN plan timed once for "
       "the whole process, whichever threads run it, and kept in the plans file for the next "
       "process) or libtorch (at::conv2d: cudnn.benchmark's pick, timed again on every thread "
       "and in every process)",
       {"plans", "libtorch"}},
      {"classes", "classes of resident data (default 10; 1000 as ImageNet's head)", {}},
      {"source",
       "files (the --data folder, decoded by the loader's workers) or resident (one batch "
       "already on the device: the same step without loading)",
       {"files", "resident"}},
      {"decode",
       "where JPEGs are decoded: cpu (TurboJPEG in the loader's workers), gpu (nvJPEG on the "
       "augment lane; the workers only read files) or auto (with crop=region and the GPU's "
       "JPEG engines: each batch split between the workers and the engines by their rates, "
       "a short trial's at the start, then the run's own; or a share given as engine_share; "
       "otherwise whichever a trial measures faster)",
       {"cpu", "gpu", "auto"}},
      {"crop",
       "with decode=cpu or auto: region (each sample's random crop drawn in the loader's worker "
       "and only that box decoded, at the smallest scale that keeps it at the model's size) or "
       "whole (the whole image decoded at the scale the model's size needs, the crop drawn on "
       "the device)",
       {"region", "whole"}},
      {"engine_share",
       "decode=auto with crop=region: the JPEG engines' fixed share of each batch, 0 to 1 "
       "(default: measured, then following both sides' rates)",
       {}},
      {"worker_nice",
       "with source=files: the loader's workers' nice value, 0 to 19 (default 0: the "
       "process's priority); above 0 the run's own threads (the JPEG engines' feed, the "
       "step's launches) get a core first when the workers fill every core",
       {}},
      {"size", "the side of the square crop the model sees (default 224)", {}},
      {"lr", "SGD's learning rate (momentum 0.9; default 0.1)", {}},
      {"precision",
       "fp32, bf16 (the forward passes under bf16 autocast, fp32 master weights) or fp16 (under "
       "fp16 autocast, with a dynamic loss scale)",
       {"fp32", "bf16", "fp16"}},
      {"layout",
       "nchw, or channels_last (weights and inputs NHWC: tensor-core convolutions without "
       "transposes, as tandem train does on a GPU)",
       {"nchw", "channels_last"}}};
  return params;
}

// The nvJPEG path the pipeline decodes with: GPU_HYBRID (Huffman on the GPU), not the hardware
// engines, which took ~41 ms per batch of 256 in the step (r50 at 0.74 of resident). The
// engines compute the serial losses in every mode too, since they wait for their stream before
// each batch (nvjpeg_decoder.cpp); TANDEM_NVJPEG_BACKEND (hardware, hybrid, default, auto)
// overrides this choice, as ImagesWorkloadGpuTest does to check the engines.
constexpr data::NvjpegBackend kPipelineBackend = data::NvjpegBackend::kHybrid;

// A decoder for `decode` (gpu or auto) on `device`, or null to decode on the CPU: always for
// decode=cpu; for gpu when nvJPEG cannot open (said on stderr); for auto when a short trial on
// this machine's files finds TurboJPEG on the cores the loader can use (all decoding at once)
// faster than nvJPEG on a batch (the choice and both rates said on stderr).
std::shared_ptr<data::NvjpegDecoder> gpu_decoder(const data::ImageFolderDataset& folder,
                                                 c10::Device device, int64_t size,
                                                 const std::string& decode) {
  if (decode == "cpu") return nullptr;
  std::string why_not = "the device is not a GPU";
  std::shared_ptr<data::NvjpegDecoder> decoder;
  if (device.is_cuda())
    decoder = data::NvjpegDecoder::open(
        device.index(), &why_not,
        std::getenv("TANDEM_NVJPEG_BACKEND") ? data::NvjpegBackend::kAuto : kPipelineBackend);
  if (!decoder) {
    std::cerr << "images: decode=" << decode << ": nvJPEG unavailable (" << why_not
              << "); decoding on the CPU\n";
    return nullptr;
  }
  if (decode == "gpu") return decoder;
  const data::DecodeTrial trial(folder, 128, /*jpeg_only=*/false);
  const int cores = data::DecodeTrial::cores();
  const double cpu = trial.cpu_rate(cores, [&](size_t i) {
    data::decode_image_interleaved(trial.files[i], trial.encoded[i].name, 3, size, size);
  });
  double gpu = 0;
  try {
    gpu = trial.engine_rate(*decoder, device);
  } catch (const std::exception& e) {
    std::cerr << "images: decode=auto chose cpu: nvJPEG failed on a trial batch ("
              << first_line(e.what()) << ")\n";
    return nullptr;
  }
  std::cerr << "images: decode=auto chose " << (gpu > cpu ? "gpu" : "cpu") << ": trial: cpu "
            << static_cast<int64_t>(cpu) << " img/s (" << cores << " cores), gpu "
            << static_cast<int64_t>(gpu) << " img/s\n";
  return gpu > cpu ? decoder : nullptr;
}

// The integer param `name` within [lo, hi], or `fallback` where it is not given.
int64_t int_param(const WorkloadOptions& o, const std::string& name, int64_t lo, int64_t hi,
                  int64_t fallback) {
  const auto it = o.params.find(name);
  if (it == o.params.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  TANDEM_CHECK_ARG(end && *end == '\0' && !text.empty() && v >= lo && v <= hi,
                   "workload images: ", name, " '", text, "' is not valid: expected ", lo, "..",
                   hi);
  return v;
}

ImagesOptions parse(const WorkloadOptions& o) {
  check_params("images", o.params, images_params());
  ImagesOptions io;
  const std::string model = param_or_default(o.params, images_params(), "model");
  io.model = model == "r18_full"   ? ImagesModel::kR18Full
             : model == "r50_full" ? ImagesModel::kR50Full
                                   : ImagesModel::kR50FrozenHead;
  io.folded_backbone = param_or_default(o.params, images_params(), "backbone") == "folded";
  io.fused_batch_norm = param_or_default(o.params, images_params(), "bn") == "fused";
  io.cast_weights_together =
      param_or_default(o.params, images_params(), "weight_casts") == "together";
  io.stats_in_convolutions = param_or_default(o.params, images_params(), "bn_stats") == "conv";
  io.kept_conv_plans = param_or_default(o.params, images_params(), "convs") == "plans";
  io.classes = int_param(o, "classes", 2, 100000, io.classes);
  io.from_files = param_or_default(o.params, images_params(), "source") == "files";
  io.crop_regions = param_or_default(o.params, images_params(), "crop") == "region";
  io.image_size = int_param(o, "size", 8, 4096, io.image_size);
  io.worker_nice = static_cast<int>(int_param(o, "worker_nice", 0, kMaxNice, io.worker_nice));
  io.precision = parse_precision(param_or_default(o.params, images_params(), "precision"));
  io.channels_last = param_or_default(o.params, images_params(), "layout") == "channels_last";
  if (o.params.count("lr")) {
    const std::string& text = o.params.at("lr");
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    TANDEM_CHECK_ARG(end && *end == '\0' && !text.empty() && v > 0 && v < 100,
                     "workload images: lr '", text,
                     "' is not valid: expected a number in (0, 100)");
    io.lr = v;
  }
  if (o.params.count("engine_share")) {
    const std::string& text = o.params.at("engine_share");
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    TANDEM_CHECK_ARG(end && *end == '\0' && !text.empty() && v >= 0 && v <= 1,
                     "workload images: engine_share '", text,
                     "' is not valid: expected a number from 0 to 1");
    io.engine_share = v;
  }
  return io;
}
}  // namespace

namespace {

/// The training folder and how its JPEGs are decoded: by the loader's workers (no decoder),
/// by nvJPEG on the augment lane (decoder), or split between both (decode=auto's split).
struct ImageSource {
  std::shared_ptr<data::ImageFolderDataset> folder;
  std::shared_ptr<data::NvjpegDecoder> decoder;  // null: the loader's workers decode
  data::EngineSplit split;  // decode=auto's: the engines' decoder and share (none: no split)
};

ImageSource open_image_source(const WorkloadOptions& options, const ImagesOptions& io) {
  TANDEM_CHECK_ARG(!options.data.empty(),
                   "workload images reads an ImageFolder: give --data DIR (one subfolder of "
                   "JPEG/PNG files per class; scripts/make_image_folder.py makes one)");
  const c10::Device device = options.device;
  const int64_t S = io.image_size;
  ImageSource src;
  data::ImageFolderOptions fo;
  fo.image_size = S;
  fo.output = data::ImageFolderOutput::kDecoded;
  src.folder = std::make_shared<data::ImageFolderDataset>(options.data, fo);
  const std::string decode = param_or_default(options.params, images_params(), "decode");
  if (decode == "auto" && io.crop_regions)
    src.split = data::open_engine_split(
        *src.folder, device, S, io.engine_share,
        options.workers > 0 ? options.workers : data::DecodeTrial::cores(), "images: decode=auto");
  if (!src.split.decoder) src.decoder = gpu_decoder(*src.folder, device, S, decode);
  if (src.split.decoder)
    src.folder = std::make_shared<data::ImageFolderDataset>(
        src.folder->with_output(data::ImageFolderOutput::kCropRegion)
            .with_engine_share(src.split.share));
  else if (src.decoder)
    src.folder = std::make_shared<data::ImageFolderDataset>(
        src.folder->with_output(data::ImageFolderOutput::kEncoded));
  else if (io.crop_regions)
    src.folder = std::make_shared<data::ImageFolderDataset>(
        src.folder->with_output(data::ImageFolderOutput::kCropRegion));
  return src;
}

/// The feeds that turn the folder's samples into the model's input: the split's two, nvJPEG's
/// decode then the crop kernel, or the crop kernel over the workers' decoded images.
std::vector<FeedStage> file_feeds(const ImageSource& src, const ImagesOptions& io,
                                  c10::Device device, const at::Generator& generator,
                                  int64_t batch_size) {
  const bool nhwc = io.channels_last;
  // The crops written in the layout the model reads.
  ResizedCropSpec spec = ResizedCropSpec::train(io.image_size).laid_out(nhwc);
  if (src.split.decoder) return data::engine_split_feeds(spec, src.split, device, nhwc, batch_size);
  if (!src.decoder)
    // Variable sizes: eager in every mode (a graph's shapes are fixed); one draw and one
    // resample kernel per batch, so a graph would save two launches.
    return {io.crop_regions ? given_crop_feed(spec, nhwc)
                            : resized_crop_feed(spec, generator, nhwc)};
  // The workers only read files; nvJPEG decodes the batch on the augment lane (its output is
  // planar), then the same crop kernel. One decoder per instance, used by that stage's thread
  // alone.
  spec.planar = true;
  return {{"augment",
           "augment",
           {"jpeg", offsets_field("jpeg"), sizes_field("jpeg")},
           {"x"},
           [spec, generator, decoder = src.decoder, device](const Tensors& in) {
             // Every row holds its file's bytes: all of them are the engines'.
             const data::DeviceDecoded d = data::decode_on_device(
                 *decoder, data::split_rows(in[0], in[1], in[2]).encoded, device, in[0]);
             const data::PackedImages& p = d.images;
             const at::Tensor& sizes = d.hwc_sizes;
             const at::Tensor boxes = draw_crop_boxes(spec, sizes, generator);
             return Tensors{resized_crop(p.packed, p.offsets, sizes, boxes, spec)};
           },
           "nvJPEG decode, then RandomResizedCrop + flip + normalize",
           {generator},
           Capture::kNever}};
}

/// One resident batch of random images and labels (no folder: the model's step alone).
Batch resident_batch(const WorkloadOptions& options, const ImagesOptions& io, int64_t classes) {
  const int64_t B = options.batch_size, S = io.image_size;
  at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>(options.data_seed());
  Batch b;
  at::Tensor x = at::randn({B, 3, S, S}, cpu).to(options.device);
  b.set("x", io.channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x);
  b.set("label", at::randint(0, classes, {B}, cpu, at::kLong).to(options.device));
  return b;
}

/// A frozen ResNet-50 as a feed stage (batch norm folded, or the module in eval mode) and a
/// linear head trained on its pooled features.
void set_frozen_backbone_and_head(ImagesWorkload& out, const ImagesOptions& io, c10::Device device,
                                  int64_t classes) {
  Workload& w = out.workload;
  models::ResNet backbone = models::resnet50();
  backbone->to(device);
  if (io.channels_last) models::to_channels_last(*backbone);
  backbone->eval();  // frozen: BatchNorm uses its running statistics
  for (auto& p : backbone->parameters()) p.set_requires_grad(false);
  auto head = torch::nn::Linear(backbone->feature_dim(), classes);
  head->to(device);
  auto bb = backbone.ptr();
  StageFn features;
  if (io.folded_backbone) {
    // Folds at its first call: in the eager warm-up, before any capture.
    auto folded = std::make_shared<models::FoldedResNet>(
        backbone, models::FoldedResNetOptions{compute_dtype(io.precision), true});
    features = [folded](const Tensors& in) {
      return Tensors{folded->features(in[0]).to(at::kFloat)};
    };
  } else {
    features = [bb, device, precision = io.precision](const Tensors& in) {
      AutocastScope autocast(device, precision);
      return Tensors{bb->features(in[0]).to(at::kFloat)};
    };
  }
  w.feeds.push_back({"backbone",
                     "backbone",
                     {"x"},
                     {"features"},
                     std::move(features),
                     io.folded_backbone ? "frozen ResNet-50 (batch norm folded) to pooled features"
                                        : "frozen ResNet-50 to pooled features",
                     {}});  // no random draws: nothing to register with its graph
  auto h = head.ptr();
  w.train.inputs = {"features", "label"};
  w.train.loss = [h](const Tensors& in) {
    return deterministic_cross_entropy(h->forward(in[0]), in[1]);
  };
  w.train.optimizer =
      std::make_shared<optim::Sgd>(head->parameters(), optim::SgdOptions{io.lr, io.momentum});
  w.train.what = "linear head, cross-entropy";
  out.logits = [bb, h](const at::Tensor& x) {
    at::NoGradGuard no_grad;
    return h->forward(bb->features(x));
  };
}

/// A whole ResNet-18 or -50 trained (autocast to the run's precision).
void set_trained_resnet(ImagesWorkload& out, const ImagesOptions& io, c10::Device device,
                        int64_t classes) {
  Workload& w = out.workload;
  const bool r50 = io.model == ImagesModel::kR50Full;
  const models::ResNetOptions ro{classes, io.fused_batch_norm, io.cast_weights_together,
                                 io.stats_in_convolutions, io.kept_conv_plans};
  models::ResNet net = r50 ? models::resnet50(ro) : models::resnet18(ro);
  net->to(device);
  if (io.channels_last) models::to_channels_last(*net);
  net->train();
  auto n = net.ptr();
  w.train.inputs = {"x", "label"};
  w.train.loss = [n, device, precision = io.precision](const Tensors& in) {
    AutocastScope autocast(device, precision);
    return deterministic_cross_entropy(n->forward(in[0]).to(at::kFloat), in[1]);
  };
  w.train.optimizer =
      std::make_shared<optim::Sgd>(net->parameters(), optim::SgdOptions{io.lr, io.momentum});
  if (needs_loss_scale(io.precision)) w.train.loss_scale = std::make_shared<LossScale>(device);
  w.train.what = r50 ? "ResNet-50 forward, cross-entropy" : "ResNet-18 forward, cross-entropy";
  out.logits = [n](const at::Tensor& x) {
    at::NoGradGuard no_grad;
    n->eval();
    at::Tensor y = n->forward(x);
    n->train();
    return y;
  };
}

}  // namespace

ImagesWorkload make_images(const WorkloadOptions& options) {
  const ImagesOptions io = parse(options);
  const c10::Device device = options.device;

  // The data first: its class count sizes the head. Resident data needs no folder.
  ImageSource src;
  if (io.from_files) src = open_image_source(options, io);
  ImagesWorkload out;
  if (src.folder)
    out.classes = src.folder->classes();
  else
    for (int64_t c = 0; c < io.classes; ++c) out.classes.push_back(std::to_string(c));
  const auto classes = static_cast<int64_t>(out.classes.size());

  torch::manual_seed(options.seed);
  Workload& w = out.workload;
  w.name = "images";
  w.device = device;
  const at::Generator generator = seeded_generator(device, options.data_seed());  // per rank
  if (io.from_files) {
    w.data = DataSource::from_dataset(src.folder, /*shuffle=*/true, /*drop_last=*/true)
                 .with_worker_nice(io.worker_nice);
    w.feeds = file_feeds(src, io, device, generator, options.batch_size);
  } else {
    w.data = DataSource::resident({resident_batch(options, io, classes)});
  }
  if (io.model == ImagesModel::kR50FrozenHead)
    set_frozen_backbone_and_head(out, io, device, classes);
  else
    set_trained_resnet(out, io, device, classes);
  return out;
}

WorkloadEntry images_entry() {
  return {"images",
          "a torchvision ResNet trained from an ImageFolder (--data DIR): JPEG/PNG decoded by "
          "the loader's workers, cropped / resized / flipped on the GPU",
          256,
          4,
          images_params(),
          [](const WorkloadOptions& o) { return make_images(o).workload; }};
}

}  // namespace tandem
