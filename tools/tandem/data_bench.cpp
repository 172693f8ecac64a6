// The data bench: see data_bench.h.
#include "data_bench.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "tandem/data/decode.h"
#include "tandem/data/engine_share.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/image_mask_pairs.h"
#include "tandem/data/nvjpeg_decoder.h"
#include "tandem/data/shrink.h"
#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/resized_crop.h"  // kCropBoxFields, ResizedCropSpec
#include "tandem/run/progress.h"
#include "tandem/run/resolve_mode.h"
#include "tandem/sampler.h"
#include "tandem/workloads/images.h"

namespace tandem {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One core running decode_one(i) for every file i, timed: a decode row of `decoder`.
DataBenchRow time_on_one_core(const std::string& title, size_t files,
                              const std::function<void(size_t)>& decode_one,
                              const std::string& decoder, const std::string& note) {
  run::Progress progress(title, static_cast<int64_t>(files));
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < files; ++i) {
    decode_one(i);
    progress.update(static_cast<int64_t>(i + 1));
  }
  progress.finish();
  DataBenchRow r;
  r.job = "decode";
  r.decode = "cpu";
  r.decoder = decoder;
  r.workers = 1;
  r.images_per_s = static_cast<double>(files) / seconds_since(start);
  r.images_per_s_per_core = r.images_per_s;
  r.note = note;
  return r;
}

// Leaves out of `files` and `paths` (index-aligned) each photo over the pixel limit of a whole
// decode (full size, on the CPU or nvJPEG), which such a decode refuses but training reads (its
// crops decode at a reduced DCT scale): not bad, so only the full-size rows go without it.
// Returns the paths left out.
std::vector<std::string> drop_over_whole_decode_limit(std::vector<std::vector<uint8_t>>& files,
                                                      std::vector<std::string>& paths) {
  std::vector<std::string> over;
  size_t kept = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    bool fits = true;
    try {
      const data::ImageInfo info = data::read_image_info(files[i], paths[i]);
      fits = info.height * info.width <= data::kMaxImagePixels;
    } catch (const std::exception&) {  // a bad file is the decode rows' to name
    }
    if (!fits) {
      over.push_back(paths[i]);
      continue;
    }
    if (kept != i) {  // a vector moved onto itself would be left empty
      files[kept] = std::move(files[i]);
      paths[kept] = std::move(paths[i]);
    }
    ++kept;
  }
  files.resize(kept);
  paths.resize(kept);
  return over;
}

// One core decoding every file to RGB: at the DCT scale for `size` (min_side = size; 1/2, 1/4,
// 1/8 or full, with the fast IDCT and upsampling decode_image uses when given a minimum), or at
// full size with libjpeg's accurate decode (PIL's).
DataBenchRow time_cpu_decode(const std::vector<std::vector<uint8_t>>& files,
                             const std::vector<std::string>& paths, int64_t size, bool scaled) {
  const int64_t min = scaled ? size : 0;
  return time_on_one_core(
      scaled ? "decode (cpu, scaled)" : "decode (cpu, full size)", files.size(),
      [&](size_t i) { data::decode_image_interleaved(files[i], paths[i], 3, min, min); },
      scaled ? "turbojpeg_scaled" : "turbojpeg_full",
      scaled ? "TurboJPEG at the smallest of 1/2, 1/4, 1/8, 1 keeping both sides >= " +
                   std::to_string(size) + ", fast IDCT and upsampling"
             : "TurboJPEG at full size, accurate IDCT and upsampling");
}

// One core decoding each file's RandomResizedCrop box only, as the loader's workers do for
// ImageFolderOutput::kCropRegion (data::decode_drawn_crop): what a faithful crop costs against
// the whole-image scaled decode. With an `engine_share`, only the files a split at that share
// leaves the workers (engines_take_costliest: the engines take the costliest crops of each block
// of positions): the workers' rate beside the engines.
DataBenchRow time_cpu_region_decode(const std::vector<std::vector<uint8_t>>& files,
                                    const std::vector<std::string>& paths, int64_t size,
                                    double engine_share = 0) {
  const ResizedCropSpec spec = ResizedCropSpec::train(size);
  const auto cost = [&](uint64_t p) { return data::crop_region_cpu_cost(spec, SampleDraw{0, p}); };
  std::vector<size_t> kept;
  for (size_t i = 0; i < files.size(); ++i)
    if (!data::engines_take_costliest(engine_share, i, cost)) kept.push_back(i);
  const bool split = engine_share > 0;
  int32_t box[kCropBoxFields];
  return time_on_one_core(
      split ? "decode (cpu, crop regions beside the engines)" : "decode (cpu, crop regions)",
      kept.size(),
      [&](size_t k) {
        data::decode_drawn_crop(files[kept[k]], paths[kept[k]], 3, size, SampleDraw{0, kept[k]},
                                box);
      },
      split ? "turbojpeg_split" : "turbojpeg_region",
      split ? detail::concat("the crop regions a split at share ", engine_share,
                             " leaves the workers (the engines take the boxes reaching furthest "
                             "down)")
            : "each file's RandomResizedCrop box only, at the smallest of 1/8, 1/4, 1/2, 1 "
              "keeping it >= " +
                  std::to_string(size) + " a side, fast IDCT and upsampling");
}

// One core decoding each file's evaluation crop, as the loader's workers do for validation
// (data::decode_center_crop: Resize(resize) + CenterCrop(size), the crop and its margin only, at
// the scale the resize needs): the evaluation's decode capacity beside training's.
DataBenchRow time_cpu_center_decode(const std::vector<std::vector<uint8_t>>& files,
                                    const std::vector<std::string>& paths, int64_t size,
                                    int64_t resize) {
  int32_t box[kCropBoxFields];
  return time_on_one_core(
      "decode (cpu, evaluation crops)", files.size(),
      [&](size_t i) { data::decode_center_crop(files[i], paths[i], 3, size, resize, box); },
      "turbojpeg_center",
      detail::concat("each file's evaluation crop only (Resize(", resize, ") + CenterCrop(", size,
                     ")), at the scale the resize needs: validation's decode"));
}

// nvJPEG on the GPU, batches of `batch` files already in host memory (a first, untimed batch
// warms the decoder up); the rate includes the host's Huffman work nvJPEG does per batch.
// Returns false, with why_not set, where nvJPEG or a GPU is absent.
bool time_gpu_decode(const std::vector<std::vector<uint8_t>>& files,
                     const std::vector<std::string>& paths, int64_t batch, c10::Device device,
                     DataBenchRow& row, std::string& why_not) {
  if (!device.is_cuda()) {
    why_not = "the device is not a GPU";
    return false;
  }
  auto decoder = data::NvjpegDecoder::open(device.index(), &why_not);
  if (!decoder) return false;
  std::vector<data::EncodedImage> encoded;
  for (size_t i = 0; i < files.size(); ++i)
    encoded.push_back({files[i].data(), files[i].size(), paths[i]});
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const size_t b = static_cast<size_t>(std::max<int64_t>(1, batch));
  auto run = [&](size_t first, size_t count) {
    const std::vector<data::EncodedImage> part(encoded.begin() + first,
                                               encoded.begin() + first + count);
    decoder->decode(part, 3, stream);
  };
  run(0, std::min(b, encoded.size()));
  c10::cuda::device_synchronize();
  run::Progress progress("decode (gpu)", static_cast<int64_t>(encoded.size()));
  const Clock::time_point start = Clock::now();
  for (size_t first = 0; first < encoded.size(); first += b) {
    run(first, std::min(b, encoded.size() - first));
    progress.update(static_cast<int64_t>(std::min(first + b, encoded.size())));
  }
  c10::cuda::device_synchronize();
  progress.finish();
  row.job = "decode";
  row.decode = "gpu";
  row.decoder = "nvjpeg";
  row.batch_size = static_cast<int64_t>(b);
  row.workers = 1;
  row.images_per_s = static_cast<double>(encoded.size()) / seconds_since(start);
  row.note = std::string("nvJPEG (") + decoder->backend() + "), one host thread, full size";
  return true;
}

// The loader alone: workers reading, decoding and packing batches into pinned slots; with
// skip_bad the files the decode rows found bad (`bad_paths`) are not in the cycle — it meets
// each many times, and a batch of nothing but bad files stops a loader — and any other bad file
// is left out of its batch; both are counted in the note.
DataBenchRow time_loader(std::shared_ptr<const data::ImageFolderDataset> folder, int workers,
                         int64_t batch_size, int64_t batches, bool skip_bad,
                         const std::set<std::string>& bad_paths) {
  LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.workers = workers;
  lo.skip_bad = skip_bad;
  lo.depth = ring_slots_for(workers);
  lo.shuffle = true;
  // Enough indices for `batches` batches plus one warm-up batch, cycling over the folder.
  const int64_t n = folder->size();
  const DistributedSampler sampler(n, 1, 0, true, 0);
  std::set<int64_t> bad;
  for (int64_t i = 0; i < n; ++i)
    if (bad_paths.count(folder->samples()[static_cast<size_t>(i)].path) != 0) bad.insert(i);
  if (static_cast<int64_t>(bad.size()) == n)
    throw Error("data-bench: every file of the folder is bad");
  for (int64_t e = 0; static_cast<int64_t>(lo.indices.size()) < (batches + 1) * batch_size; ++e)
    for (const int64_t i : sampler.indices(e))
      if (bad.count(i) == 0) lo.indices.push_back(i);
  lo.indices.resize((batches + 1) * batch_size);
  Loader loader(folder, lo);
  run::Progress progress("loader", batches + 1);
  auto first = loader.next();  // the first batch waits for the workers to start: untimed
  TANDEM_CHECK_ARG(first.has_value(), "the loader gave no batch");
  loader.release(*first);
  const Clock::time_point start = Clock::now();
  int64_t images = 0, got = 0;
  while (auto b = loader.next()) {
    images += static_cast<int64_t>(b->indices.size());
    loader.release(*b);
    progress.update(++got + 1);
  }
  progress.finish();
  DataBenchRow r;
  r.job = "loader";
  r.decode = "cpu";
  r.batch_size = batch_size;
  r.workers = workers;
  r.images_per_s = static_cast<double>(images) / seconds_since(start);
  r.images_per_s_per_core = r.images_per_s / workers;
  r.note =
      "read + each file's RandomResizedCrop box decoded (as tandem train --crop region) + pack "
      "into pinned slots, no GPU";
  for (const SkippedSample& s : loader.skipped()) bad.insert(s.index);  // met again each cycle
  if (!bad.empty()) r.note += detail::concat("; ", bad.size(), " bad file(s) skipped");
  return r;
}

// "3 bad files left out (--skip-bad): a.jpg: why; b.jpg: why; ...", at most 3 named.
std::string describe_skipped(const std::vector<std::string>& bad) {
  std::string text = detail::concat(bad.size(), " bad file(s) left out (--skip-bad): ");
  for (size_t i = 0; i < bad.size() && i < 3; ++i) text += (i > 0 ? "; " : "") + bad[i];
  return text + (bad.size() > 3 ? "; ..." : "");
}
}  // namespace

void check_data_bench_options(const DataBenchOptions& o) {
  TANDEM_CHECK_ARG(!o.data.empty(), "data-bench needs --data DIR (an ImageFolder)");
  TANDEM_CHECK_ARG(o.decode == "cpu" || o.decode == "gpu" || o.decode == "auto", "--decode '",
                   o.decode, "' is not valid: expected cpu, gpu or auto");
  TANDEM_CHECK_ARG(o.decode_images >= 1, "--images ", o.decode_images,
                   " is not valid: expected >= 1 files");
  TANDEM_CHECK_ARG(o.loader_images >= 1, "--loader-images ", o.loader_images,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(!o.run.workers || (*o.run.workers >= 1 && *o.run.workers <= kMaxLoaderWorkers),
                   "--workers ", o.run.workers.value_or(0), " is not valid: expected 1 to ",
                   kMaxLoaderWorkers, " loader threads");
  TANDEM_CHECK_ARG(!o.run.batch_size || *o.run.batch_size >= 1, "--batch-size ",
                   o.run.batch_size.value_or(0), " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(!o.run.steps || *o.run.steps >= 0, "--steps ", o.run.steps.value_or(0),
                   " is not valid: expected >= 1 (or 0: no end-to-end rows)");
  TANDEM_CHECK_ARG(!o.run.warmup || *o.run.warmup >= 0, "--warmup ", o.run.warmup.value_or(0),
                   " is not valid: expected >= 0");
}

DataBenchResult run_data_bench(const DataBenchOptions& o) {
  check_data_bench_options(o);
  // An image + mask folder would read as two classes, "images" and "masks": refused.
  TANDEM_CHECK_ARG(
      !data::is_image_mask_pairs_folder(o.data),
      "data-bench reads an ImageFolder (one subfolder of images per class); ", o.data,
      " holds images/ and masks/ (segmentation pairs), which it would read as two classes: time "
      "reading it with tandem train --data ",
      o.data, " (its progress gives img/s)");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  run::RunRequest request = o.run;
  request.data = o.data;
  request.params["model"] = o.model;
  request.params["decode"] = o.decode;  // the end-to-end run decodes as asked (auto: by a trial)
  const bool end_to_end = !request.steps || *request.steps > 0;
  if (!end_to_end) request.steps = 1;
  request = run::resolve(request);  // validates device, batch size and counts before the long work
  const int workers = *request.workers;  // the run layer's one default where none was given
  const int64_t size = request.params.count("size") ? std::stoll(request.params.at("size")) : 224;

  data::ImageFolderOptions fo;
  fo.image_size = size;
  // The loader row decodes as training does by default (tandem train --crop region, the images
  // workload's crop=region): each sample's box only.
  fo.output = data::ImageFolderOutput::kCropRegion;
  auto folder = std::make_shared<data::ImageFolderDataset>(o.data, fo);
  DataBenchResult result;
  result.device_name = run::device_name(parse_device(request.device));
  std::cerr << "data-bench: " << folder->size() << " images in " << folder->classes().size()
            << " classes under " << o.data << "; " << cores << " cores\n";
  const data::KeptSize kept = data::kept_size(size);
  const std::string hint =
      data::shrink_hint(data::survey_photo_sizes(*folder, kept), kept, size, o.data);
  if (!hint.empty()) {
    std::cerr << "data-bench: " << hint << "\n";
    result.notes.push_back(hint);
  }

  // Files read into memory first: the decode rows time decoding, not the disk. With --skip-bad
  // each is decoded once, untimed, so a bad one is left out before the timed loops (which then
  // cannot fail) and counted; without, the first bad one stops the bench naming it.
  std::vector<std::string> paths, bad;
  std::set<std::string> bad_paths;
  std::vector<std::vector<uint8_t>> files;
  for (const auto& sample : folder->spread_samples(o.decode_images)) {
    try {
      std::vector<uint8_t> bytes = data::read_file(sample.path);
      if (request.skip_bad) data::decode_image_interleaved(bytes, sample.path, 3, size, size);
      paths.push_back(sample.path);
      files.push_back(std::move(bytes));
    } catch (const std::exception& e) {  // a file's: read_file and the decoders name it
      if (!request.skip_bad) throw;
      bad.push_back(first_line(e.what()));
      bad_paths.insert(sample.path);
    }
  }
  if (!bad.empty()) {
    result.notes.push_back("decode rows: " + describe_skipped(bad));
    std::cerr << "data-bench: " << result.notes.back() << "\n";
  }
  if (files.empty())
    throw Error(detail::concat("data-bench: every one of the ", bad.size(),
                               " files read for the decode rows was bad (", bad.front(), ")"));
  if (o.decode != "gpu") {
    result.rows.push_back(time_cpu_decode(files, paths, size, true));
    result.rows.push_back(time_cpu_region_decode(files, paths, size));
    result.rows.push_back(time_cpu_region_decode(files, paths, size, 0.5));
    result.rows.push_back(time_cpu_center_decode(files, paths, size, folder->resize_size()));
  }
  // The full-size rows come last: they go without the photos a whole decode refuses.
  const size_t read = files.size();
  const std::vector<std::string> over = drop_over_whole_decode_limit(files, paths);
  if (!over.empty()) {
    result.notes.push_back(
        detail::concat("full-size decode rows: ", over.size(), " of the ", read,
                       " files left out, larger than a whole decode takes (", data::kMaxImagePixels,
                       " pixels; training decodes them at a reduced scale): ", over.front(),
                       over.size() > 1 ? ", ..." : ""));
    std::cerr << "data-bench: " << result.notes.back() << "\n";
  }
  if (o.decode != "gpu") {
    if (!files.empty()) result.rows.push_back(time_cpu_decode(files, paths, size, false));
    result.rows.push_back(time_loader(folder, workers, *request.batch_size,
                                      std::max<int64_t>(1, o.loader_images / *request.batch_size),
                                      request.skip_bad, bad_paths));
  }
  if (o.decode != "cpu") {
    DataBenchRow row;
    std::string why_not;
    if (files.empty())
      why_not = "every file is over the pixel limit of a whole decode";
    else if (time_gpu_decode(files, paths, *request.batch_size, parse_device(request.device), row,
                             why_not))
      result.rows.push_back(row);
    if (!why_not.empty()) result.notes.push_back("gpu decode (nvJPEG) not timed: " + why_not);
  }

  if (end_to_end) {
    for (const std::string source : {"files", "resident"}) {
      run::RunRequest b = request;
      b.params["source"] = source;
      b.workers = workers;
      std::cerr << "data-bench: workload images (" << o.model << ", " << source << "), "
                << run::mode_name(b.mode) << ", batch " << *b.batch_size << "\n";
      const run::RunReport r = run::run_auto(b).report;  // a named mode runs as asked
      if (source == "files") {
        DataBenchRow row;
        row.job = o.model;
        row.decode = o.decode == "auto" ? "" : o.decode;  // auto's choice is on stderr
        row.batch_size = *b.batch_size;
        row.workers = workers;
        row.images_per_s = r.samples_per_s;
        result.rows.push_back(row);
        result.stage_report = run::describe_report(r);
      } else {
        result.rows.back().resident_images_per_s = r.samples_per_s;
        result.rows.back().note = detail::concat(
            "mode ", run::mode_name(b.mode), "; ",
            static_cast<int>(100.0 * result.rows.back().images_per_s / r.samples_per_s + 0.5),
            "% of the resident rate");
      }
    }
  }
  return result;
}

std::string describe_data_bench(const DataBenchResult& r) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %-16s %6s %7s %12s %12s %12s  %s\n", "job", "decode",
                "batch", "workers", "img/s", "img/s/core", "resident", "note");
  os << line;
  for (const auto& row : r.rows) {
    auto num = [](double v) {
      char b[32];
      if (v > 0)
        std::snprintf(b, sizeof b, "%.0f", v);
      else
        std::snprintf(b, sizeof b, "-");
      return std::string(b);
    };
    std::snprintf(line, sizeof line, "%-16s %-16s %6s %7d %12s %12s %12s  %s\n", row.job.c_str(),
                  (row.decoder.empty() ? row.decode : row.decoder).c_str(),
                  row.batch_size ? std::to_string(row.batch_size).c_str() : "-", row.workers,
                  num(row.images_per_s).c_str(), num(row.images_per_s_per_core).c_str(),
                  num(row.resident_images_per_s).c_str(), row.note.c_str());
    os << line;
  }
  for (const auto& n : r.notes) os << "note: " << n << "\n";
  if (!r.stage_report.empty()) os << "\nend to end, fed from the folder:\n" << r.stage_report;
  return os.str();
}

nlohmann::json data_bench_json(const DataBenchResult& r, const std::string& command) {
  nlohmann::json rows = nlohmann::json::array(), loader = nlohmann::json::array();
  auto or_null = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const auto& row : r.rows)
    (row.job == "loader" ? loader : rows)
        .push_back(
            {{"impl", "tandem"},
             {"job", row.job},
             {"batch_size",
              row.batch_size ? nlohmann::json(row.batch_size) : nlohmann::json(nullptr)},
             {"workers", row.workers},
             {"decode", row.decode.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.decode)},
             {"images_per_s", row.images_per_s},
             {"images_per_s_per_core", or_null(row.images_per_s_per_core)},
             {"resident_images_per_s", or_null(row.resident_images_per_s)},
             {"decoder",
              row.decoder.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.decoder)},
             {"note", row.note}});
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"device", r.device_name}, {"date", date},    {"command", command}, {"rows", rows},
          {"loader", loader},        {"notes", r.notes}};
}

}  // namespace tandem
