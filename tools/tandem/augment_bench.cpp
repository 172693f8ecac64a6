// The augmentation micro-benchmark.
#include "augment_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "tandem/error.h"
#include "tandem/run/sweep.h"

namespace tandem {

namespace {
constexpr int kLaunchesPerTiming = 10;
constexpr int kInputSets = 4;

// Milliseconds per call of `fn`, median over `repeats` timings of kLaunchesPerTiming calls.
template <typename Fn>
double time_ms(c10::Device device, int repeats, Fn fn) {
  for (int i = 0; i < 3; ++i) fn(i);  // warm-up: module load, allocator
  std::vector<double> samples;
  if (device.is_cuda()) {
    c10::cuda::device_synchronize();
    auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    for (int r = 0; r < repeats; ++r) {
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      start.record(stream);
      for (int i = 0; i < kLaunchesPerTiming; ++i) fn(i);
      end.record(stream);
      end.synchronize();
      samples.push_back(start.elapsed_time(end) / kLaunchesPerTiming);
    }
  } else {
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn(r);
      samples.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return run::median(samples).value_or(0.0);  // repeats > 0: never empty
}
}  // namespace

std::vector<AugmentBenchRow> run_augment_bench(const std::vector<int64_t>& batch_sizes,
                                               c10::Device device, int repeats,
                                               const AugmentSpec& spec,
                                               const std::vector<AugmentSampling>& samplings) {
  TANDEM_CHECK_ARG(repeats > 0, "repeat count ", repeats, " is not valid: expected > 0");
  TANDEM_CHECK_ARG(!samplings.empty(), "no sampling given: expected auto, gather or staged");
  std::vector<AugmentBenchRow> rows;
  for (int64_t bs : batch_sizes) {
    TANDEM_CHECK_ARG(bs > 0, "batch size ", bs, " is not valid: expected a positive number");
    auto cpu_gen = at::make_generator<at::CPUGeneratorImpl>(bs);
    std::vector<at::Tensor> inputs;
    for (int i = 0; i < kInputSets; ++i)
      inputs.push_back(
          at::randint(0, 256, {bs, 3, 256, 256}, cpu_gen, at::TensorOptions().dtype(at::kByte))
              .to(device));
    const at::Generator gen = seeded_generator(device, bs);
    const AugmentParams params = draw_augment_params(spec, bs, 256, 256, device, gen);
    const double bytes = static_cast<double>(bs) * 3 * 256 * 256 +
                         static_cast<double>(bs) * 3 * spec.out_h * spec.out_w * 4;
    double copy_gb_per_s = 0;
    if (device.is_cuda()) {
      const at::Tensor src = at::empty({bs, 3, spec.out_h, spec.out_w},
                                       at::TensorOptions().dtype(at::kFloat).device(device))
                                 .uniform_();
      at::Tensor dst = at::empty_like(src);
      const double copy_ms = time_ms(device, repeats, [&](int) { dst.copy_(src); });
      copy_gb_per_s = 2.0 * static_cast<double>(src.nbytes()) / (copy_ms * 1e-3) / 1e9;
    }
    const std::vector<AugmentSampling> cpu_only{AugmentSampling::kAuto};
    for (AugmentSampling requested : device.is_cuda() ? samplings : cpu_only) {
      AugmentBenchRow row;
      row.mode = device.is_cuda() ? "gpu" : "cpu";
      // Resolved once, so that every launch of the row samples the same way.
      const AugmentSampling sampling =
          device.is_cuda() ? resolve_augment_sampling(inputs[0], spec, requested) : requested;
      if (device.is_cuda()) {
        row.sampling = to_string(sampling);
        row.requested = to_string(requested);
      }
      row.batch_size = bs;
      const int timings = device.is_cuda() ? repeats : std::max(1, repeats / 10);
      row.ms_per_batch = time_ms(
          device, timings, [&](int i) { augment(inputs[i % kInputSets], params, spec, sampling); });
      row.ms_per_batch_with_draw = time_ms(device, timings, [&](int i) {
        augment(inputs[i % kInputSets], draw_augment_params(spec, bs, 256, 256, device, gen), spec,
                sampling);
      });
      row.steps_per_s = 1000.0 / row.ms_per_batch;
      row.images_per_s = row.steps_per_s * static_cast<double>(bs);
      row.gb_per_s = bytes / (row.ms_per_batch * 1e-3) / 1e9;
      row.copy_gb_per_s = copy_gb_per_s;
      rows.push_back(row);
    }
  }
  return rows;
}

std::string describe_augment_bench(const std::vector<AugmentBenchRow>& rows) {
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line, "%-5s %-8s %6s %12s %10s %12s %9s %10s %14s\n", "mode",
                "sampling", "batch", "ms/batch", "batches/s", "images/s", "GB/s", "copy GB/s",
                "ms with draw");
  os << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-5s %-8s %6lld %12.4f %10.1f %12.0f %9.1f %10.1f %14.4f\n",
                  r.mode.c_str(), r.sampling.empty() ? "-" : r.sampling.c_str(),
                  static_cast<long long>(r.batch_size), r.ms_per_batch, r.steps_per_s,
                  r.images_per_s, r.gb_per_s, r.copy_gb_per_s, r.ms_per_batch_with_draw);
    os << line;
  }
  return os.str();
}

nlohmann::json augment_bench_json(const std::vector<AugmentBenchRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows)
    out.push_back({{"impl", "tandem"},
                   {"scenario", "augment"},
                   {"mode", r.mode},
                   {"sampling", r.sampling},
                   {"requested_sampling", r.requested},
                   {"batch_size", r.batch_size},
                   {"ms_per_batch", r.ms_per_batch},
                   {"steps_per_s", r.steps_per_s},
                   {"images_per_s", r.images_per_s},
                   {"gb_per_s", r.gb_per_s},
                   {"copy_gb_per_s", r.copy_gb_per_s},
                   {"ms_per_batch_with_draw", r.ms_per_batch_with_draw}});
  return out;
}

}  // namespace tandem
