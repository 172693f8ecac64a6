// The CPU workers and the JPEG engines decoding together: see engine_split.h.
#include "tandem/data/engine_split.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <thread>

#include "tandem/data/decode.h"
#include "tandem/detail/thread_name.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"

namespace tandem::data {

namespace {
using Clock = std::chrono::steady_clock;

// Above this many crop regions a second per core (photos of well under a megapixel), the
// loader's workers keep the step fed without the engines, and the engines' host work on the
// feed stage's thread costs more than it brings: on the H200 machine, photos of 320-640 px
// (1,100-1,600 regions a second on one core alone, ~950 with all 15 decoding at once) trained
// ResNet-18 at 0.81-0.90 of the CPU-only rate with a split at any share tried, photos of
// 1000-2000 px (200-300 a second on one core, ~190 with all at once) 1.2-1.7x faster.
// (A core's rate: DecodeTrial::cpu_rate's over its cores.)
constexpr double kCoreRateWithoutEngines = 600;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

DecodeTrial::DecodeTrial(const ImageFolderDataset& folder, int64_t n, bool jpeg_only) {
  for (const auto& sample : folder.spread_samples(n)) {
    std::vector<uint8_t> bytes = read_file(sample.path);
    if (jpeg_only) {
      const ImageInfo info = read_image_info(bytes, sample.path);
      if (info.format != ImageFormat::kJpeg || info.channels == 4) continue;
    }
    files.push_back(std::move(bytes));  // a moved vector keeps its buffer: encoded stays valid
    encoded.push_back({files.back().data(), files.back().size(), sample.path});
  }
}

double DecodeTrial::cpu_rate(int cores, const std::function<void(size_t)>& decode_one,
                             std::vector<double>* seconds_per_file) const {
  if (files.empty()) return 0;
  cores = std::max(1, cores);
  const size_t n = files.size(), each = std::min<size_t>(n, kTrialDecodesPerCore);
  // Per core: each file's decode seconds and count (merged after the join).
  std::vector<std::vector<std::pair<double, int>>> timed(
      static_cast<size_t>(cores), std::vector<std::pair<double, int>>(n, {0.0, 0}));
  const auto t = Clock::now();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> failed(static_cast<size_t>(cores));
  for (int c = 0; c < cores; ++c)
    threads.emplace_back([&, c] {
      name_this_thread("decode trial " + std::to_string(c));
      try {
        const size_t first = static_cast<size_t>(c) * n / static_cast<size_t>(cores);
        for (size_t k = 0; k < each; ++k) {
          const size_t i = (first + k) % n;
          const auto started = Clock::now();
          decode_one(i);
          timed[static_cast<size_t>(c)][i].first += seconds_since(started);
          ++timed[static_cast<size_t>(c)][i].second;
        }
      } catch (...) {
        failed[static_cast<size_t>(c)] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  const double rate = static_cast<double>(each) * cores / seconds_since(t);
  if (seconds_per_file) {
    seconds_per_file->assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      double seconds = 0;
      int count = 0;
      for (const auto& core : timed) {
        seconds += core[i].first;
        count += core[i].second;
      }
      if (count > 0) (*seconds_per_file)[i] = seconds / count;
    }
  }
  return rate;
}

double DecodeTrial::engine_rate(NvjpegDecoder& decoder, c10::Device device) const {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  decoder.decode(encoded, 3, stream.stream());
  stream.synchronize();
  const auto t = Clock::now();
  decoder.decode(encoded, 3, stream.stream());
  stream.synchronize();
  return static_cast<double>(files.size()) / seconds_since(t);
}

int DecodeTrial::cores() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
}

EngineSplit open_engine_split(const ImageFolderDataset& folder, c10::Device device, int64_t size,
                              double given, int workers, const std::string& who) {
  EngineSplit split;
  split.workers = std::max(1, workers);
  if (!device.is_cuda() || given == 0) return split;
  std::string why_not;
  std::shared_ptr<NvjpegDecoder> decoder =
      NvjpegDecoder::open(device.index(), &why_not, NvjpegBackend::kHardware);
  if (!decoder) {
    std::cerr << who << ": no JPEG engines to share the decode with (" << why_not << ")\n";
    return split;
  }
  if (given > 0) {
    split.decoder = decoder;
    split.share = std::make_shared<EngineShare>(given);
    std::cerr << who << ": the JPEG engines decode " << split.share->share()
              << " of each batch (given), the CPU workers the rest\n";
    return split;
  }
  const DecodeTrial trial(folder, 64, /*jpeg_only=*/true);
  if (trial.files.empty()) return split;
  const int cores = DecodeTrial::cores();
  std::vector<double> seconds_per_file;
  const double cpu = trial.cpu_rate(
      cores,
      [&](size_t i) {
        int32_t box[kCropBoxFields];
        decode_drawn_crop(trial.files[i], trial.encoded[i].name, 3, size, SampleDraw{1, i}, box);
      },
      &seconds_per_file);
  if (cpu / cores > kCoreRateWithoutEngines) {
    std::cerr << who << ": no split: one core decodes " << static_cast<int64_t>(cpu / cores)
              << " crop regions a second here, and the workers feed the step on their own\n";
    return split;
  }
  double engines = 0;
  try {
    engines = trial.engine_rate(*decoder, device);
  } catch (const std::exception& e) {
    std::cerr << who << ": the JPEG engines failed on a trial batch (" << first_line(e.what())
              << "): decoding on the CPU\n";
    return split;
  }
  // The workers keep the cheaper crops of the split (engines_take_costliest), so at the share
  // they decode faster than the trial's every crop: the first share counts that in.
  const ResizedCropSpec spec = ResizedCropSpec::train(size);
  auto share = std::make_shared<EngineShare>(
      first_balanced_share(engines, cpu, seconds_per_file,
                           [&](uint64_t p) {
                             return crop_region_cpu_cost(spec, SampleDraw{1, p});
                           }),
      /*adaptive=*/true);
  std::cerr << who << ": the JPEG engines start with " << share->share()
            << " of each batch, the CPU workers the rest, then follow both sides' rates (trial: "
            << "CPU crop regions " << static_cast<int64_t>(cpu) << " img/s on " << cores
            << " cores, engines " << static_cast<int64_t>(engines) << " img/s)\n";
  if (share->share() <= 0) return split;
  split.decoder = decoder;
  split.share = share;
  return split;
}

DeviceDecoded decode_on_device(NvjpegDecoder& decoder, const std::vector<EncodedImage>& encoded,
                               c10::Device device, const at::Tensor& bytes) {
  DeviceDecoded out;
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  const bool in_place = bytes.defined() && bytes.is_pinned();
  out.images =
      decoder.decode(encoded, 3, stream.stream(),
                     in_place ? HostBytes::kPinnedUntilStreamDone : HostBytes::kUntilReturn);
  if (in_place) {
    // The allocator records an event on the stream when the block is freed, and hands the block
    // out again only once it completed. Pinned memory from elsewhere (not the allocator's):
    // nothing would keep it, so the decode's work is waited for here.
    const c10::Storage& storage = bytes.storage();
    if (!at::getHostAllocator(at::kCUDA)->record_event(
            storage.mutable_data(), storage.data_ptr().get_context(), stream.unwrap()))
      stream.synchronize();
  }
  std::vector<int64_t> hwc;  // the crop's sizes are (H, W, C) in either layout
  for (const auto& s : out.images.sizes_host) hwc.insert(hwc.end(), {s[1], s[2], s[0]});
  out.hwc_sizes = host_to_device(hwc, device).view({static_cast<int64_t>(encoded.size()), 3});
  return out;
}

at::Tensor host_to_device(const std::vector<int64_t>& values, c10::Device device) {
  at::Tensor host = at::tensor(values, at::kLong);
  // From pageable memory the copy may wait for the stream's earlier work; from pinned memory it
  // is queued behind it, and the host allocator keeps the block until the copy has read it.
  if (device.is_cuda()) host = host.pin_memory();
  return host.to(device, /*non_blocking=*/true);
}

SplitRows split_sides(const at::Tensor& sizes) {
  const int64_t* len = sizes.data_ptr<int64_t>();
  SplitRows r;
  for (int64_t b = 0; b < sizes.size(0); ++b) (len[b] == 0 ? r.cpu : r.engines).push_back(b);
  return r;
}

SplitRows split_rows(const at::Tensor& jpeg, const at::Tensor& offsets, const at::Tensor& sizes) {
  const uint8_t* bytes = jpeg.data_ptr<uint8_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* len = sizes.data_ptr<int64_t>();
  SplitRows r = split_sides(sizes);
  for (const int64_t b : r.engines)
    r.encoded.push_back({bytes + off[b], static_cast<size_t>(len[b]),
                         "image " + std::to_string(b) + " of the batch"});
  return r;
}

EngineSplit companion_split(const EngineSplit& split, c10::Device device, int workers) {
  EngineSplit out;
  out.workers = std::max(1, workers);
  if (!split.decoder || !device.is_cuda()) return out;
  out.decoder = NvjpegDecoder::open(device.index(), nullptr, NvjpegBackend::kHardware);
  if (out.decoder)
    out.share = std::make_shared<EngineShare>(split.share->share(), split.share->adaptive());
  return out;
}

at::Tensor engine_crops(const ResizedCropSpec& spec, const EngineSplit& split,
                        const std::vector<EncodedImage>& encoded, c10::Device device,
                        int64_t batch_size, const at::Tensor& boxes, const at::Tensor& bytes) {
  const ThreadUsage before = this_thread_usage();
  const auto started = Clock::now();
  const DeviceDecoded d = decode_on_device(*split.decoder, encoded, device, bytes);
  const double decode_seconds = seconds_since(started);
  const ThreadUsage used = this_thread_usage() - before;
  ResizedCropSpec planar = spec;
  planar.planar = true;
  at::Tensor x =
      resized_crop(d.images.packed, d.images.offsets, d.hwc_sizes,
                   boxes.defined() ? boxes : draw_crop_boxes(planar, d.hwc_sizes), planar);
  split.share->record_engines(static_cast<int64_t>(encoded.size()), decode_seconds, used);
  split.share->rebalance(split.workers, batch_size);
  return x;
}

std::vector<FeedStage> engine_split_feeds(const ResizedCropSpec& given, EngineSplit split,
                                          c10::Device device, bool channels_last,
                                          int64_t batch_size) {
  TANDEM_CHECK_ARG(split.decoder && split.share, "engine_split_feeds: the split has no decoder");
  // Both sides' crops written in the layout the model reads.
  const ResizedCropSpec spec = given.laid_out(channels_last);
  FeedStage e;
  e.name = "engines";
  e.lane = "engines";
  e.inputs = {"jpeg", offsets_field("jpeg"), sizes_field("jpeg"), "crop_box"};
  e.outputs = {kEngineCropsField};
  e.fn = [spec, split, device, batch_size](const Tensors& in) {
    const SplitRows r = split_rows(in[0], in[1], in[2]);  // the jpeg fields stay on the host
    if (r.engines.empty())                                // the workers decoded the whole batch
      return Tensors{
          at::empty({0, static_cast<int64_t>(spec.mean.size()), spec.out_h, spec.out_w},
                    at::TensorOptions()
                        .dtype(at::kFloat)
                        .device(device)
                        .memory_format(spec.channels_last ? at::MemoryFormat::ChannelsLast
                                                          : at::MemoryFormat::Contiguous))};
    const at::Tensor rows = host_to_device(r.engines, device);
    return Tensors{engine_crops(spec, split, r.encoded, device, batch_size,
                                in[3].index_select(0, rows), in[0])};
  };
  e.what =
      "the rows the loader left to the JPEG engines: decoded (nvJPEG, hardware), then "
      "RandomResizedCrop (boxes from the loader) + flip + normalize";
  e.report = [split] { return split.share->report(split.workers); };
  e.capture = Capture::kNever;  // nvJPEG's host work, and sizes that vary
  return {e, split_crops_feed(spec, channels_last)};
}

FeedStage split_crops_feed(const ResizedCropSpec& given, bool channels_last) {
  const ResizedCropSpec spec = given.laid_out(channels_last);
  FeedStage f;
  f.name = "augment";
  f.lane = "augment";
  f.inputs = {"image",    offsets_field("image"), sizes_field("image"), sizes_field("jpeg"),
              "crop_box", kEngineCropsField};
  f.outputs = {"x"};
  f.fn = [spec](const Tensors& in) {
    const at::Tensor& boxes = in[4];
    const at::Tensor& engine_x = in[5];
    const int64_t B = boxes.size(0);
    const SplitRows r = split_sides(in[3]);  // an empty "jpeg": the row a worker decoded
    TORCH_CHECK(engine_x.size(0) == static_cast<int64_t>(r.engines.size()), "the engines' ",
                engine_x.size(0), " crops do not match the batch's ", r.engines.size(),
                " rows left to them");
    if (r.cpu.empty()) return Tensors{engine_x};
    const c10::Device device = boxes.device();
    const at::Tensor cpu_rows = host_to_device(r.cpu, device);
    at::Tensor cpu_x =
        resized_crop(in[0], in[1].index_select(0, cpu_rows), in[2].index_select(0, cpu_rows),
                     boxes.index_select(0, cpu_rows), spec);
    at::Tensor x = cpu_x;
    if (!r.engines.empty()) {  // each side's crops into its rows of the batch
      x = at::empty({B, cpu_x.size(1), cpu_x.size(2), cpu_x.size(3)},
                    cpu_x.options().memory_format(cpu_x.suggest_memory_format()));
      x.index_copy_(0, cpu_rows, cpu_x);
      x.index_copy_(0, host_to_device(r.engines, device), engine_x);
    }
    return Tensors{x};
  };
  f.what =
      "RandomResizedCrop (boxes from the loader) + flip + normalize of the rows the workers "
      "decoded, beside the engines' crops";
  f.capture = Capture::kNever;  // sizes that vary
  return f;
}

}  // namespace tandem::data
