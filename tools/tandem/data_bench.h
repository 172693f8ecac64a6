// `tandem data-bench --data DIR`: how fast tandem reads a folder of images — decode on one core
// (DCT-scaled and full size), the whole loader with its workers, nvJPEG on the GPU where present —
// and the end-to-end rate of workload "images" fed from the folder beside the same step on
// device-resident data, with the stage report. Built where the data layer is.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tandem/run/request.h"

namespace tandem {

struct DataBenchOptions {
  std::string data;
  int64_t decode_images = 1000;  ///< files timed on one core (and on the GPU)
  int64_t loader_images = 8000;  ///< images the loader-only run drains (whole batches)
  /// cpu, gpu or auto: which decode rows are timed (auto: both), and how the end-to-end run
  /// decodes (workload images' decode param; auto: whichever a short trial finds faster).
  std::string decode = "auto";
  /// End to end: workload images at these settings (steps, mode, device, batch size, workers,
  /// model); its params are set by the data bench. steps == 0 skips it. Its workers (the run
  /// layer's default where unset) are the loader row's too.
  run::RunRequest run;
  std::string model = "r50_frozen_head";
};

struct DataBenchRow {
  std::string job;     ///< decode, loader, or the model's name (end to end)
  std::string decode;  ///< cpu or gpu; "" when not known (an end-to-end run with auto)
  /// decode rows: turbojpeg_scaled, turbojpeg_region (training's crop boxes), turbojpeg_split
  /// (those a split leaves the workers), turbojpeg_center (the evaluation's crops), turbojpeg_full
  /// or nvjpeg
  std::string decoder;
  int64_t batch_size = 0;
  int workers = 0;
  double images_per_s = 0;
  double images_per_s_per_core = 0;  ///< decode and loader rows
  double resident_images_per_s = 0;  ///< end-to-end rows
  std::string note;
};

struct DataBenchResult {
  std::vector<DataBenchRow> rows;
  std::vector<std::string> notes;
  std::string stage_report;  ///< the end-to-end run's (describe_report)
  std::string device_name;
};

/// Throws InvalidArgument naming the first out-of-range option as its command-line flag, in one
/// line: --images, --workers, --batch-size >= 1 (and the loader image count), --steps and
/// --warmup >= 0, --decode cpu, gpu or auto, --data given.
void check_data_bench_options(const DataBenchOptions& options);

/// Runs every part, printing progress to stderr. Throws InvalidArgument for bad options
/// (check_data_bench_options) or a bad folder, naming them — an image + mask folder (images/,
/// masks/) too, which an ImageFolder would read as two classes. With run.skip_bad a file that
/// fails to read or decode is left out of every row and counted (DataBenchResult::notes);
/// without, the first stops the bench naming it.
DataBenchResult run_data_bench(const DataBenchOptions& options);

std::string describe_data_bench(const DataBenchResult& result);
/// {device, date, command, rows: [...], loader: [...]}: the decode and end-to-end rows in
/// benchmarks/results/data.json's row format (decode "cpu" | "gpu" | null, the decoder named
/// apart); the loader-only rows, a job that format does not have, under "loader".
nlohmann::json data_bench_json(const DataBenchResult& result, const std::string& command);

}  // namespace tandem
