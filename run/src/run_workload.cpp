// A run of a workload: resolve the request, build the instance, time the steady state, report.
#include "tandem/run/run_workload.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <memory>

#include "tandem/cuda_wait.h"
#include "tandem/detail/lane.h"
#include "tandem/error.h"
#include "tandem/run/gpu_monitor.h"
#include "tandem/run/progress.h"
#include "tandem/runner.h"

namespace tandem::run {

namespace {
void synchronize(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}
}  // namespace

RunReport run_workload(const RunRequest& unresolved, const RunHooks& hooks) {
  const RunRequest request = resolve(unresolved);
  TANDEM_CHECK_ARG(request.mode.has_value(),
                   "mode auto is resolved first (resolve_mode), then run by run_workload()");
  const int64_t steps = *request.steps, warmup = *request.warmup;
  const c10::Device device = parse_device(request.device);
  RunReport result;
  result.request = request;

  at::globalContext().setBenchmarkCuDNN(*request.cudnn_benchmark);
  if (request.cudnn_benchmark_limit)
    at::globalContext().setBenchmarkLimitCuDNN(*request.cudnn_benchmark_limit);
  // Before anything is built: the engines' and the stages' threads wait as asked from their
  // first call. "auto" leaves CUDA's setting (and anything the caller set) as it is.
  if (request.cuda_wait != "auto") set_cuda_wait(device, parse_cuda_wait(request.cuda_wait));
  RunOptions ro = runner_options(request);
  std::unique_ptr<Trace> trace;
  if (!request.trace_path.empty()) {
    trace = std::make_unique<Trace>();
    ro.trace = trace.get();
  }
  Workload workload = request.workload.make(workload_options(request));
  if (hooks.prepare_workload) hooks.prepare_workload(workload);
  Runner runner(workload, ro);
  // Profiled steps follow the timed ones, and one more step after them is where the profiler
  // stops: on the thread that started it (the clock stage's), once their work is done.
  const int64_t profiled = request.kernel_steps;
  const int64_t total_steps = warmup + steps + (profiled > 0 ? profiled + 1 : 0);
  runner.prepare(total_steps);

  // The clock starts when step `warmup` begins its exclusive work: in serial mode when it
  // enters the first stage; pipelined, when it enters the last (training) stage, so exactly
  // `steps` training steps remain and the stages ahead of it are in their steady state.
  const int clock_stage = runner.step_start_stage();
  runner.set_timing(warmup, request.device_timing_every);
  GpuMonitor monitor(device);
  Progress progress(request.workload.name + " " + mode_name(request.mode), total_steps,
                    request.progress);
  const int last_stage = runner.num_stages() - 1;
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now(), end{};
  std::unique_ptr<KernelRecorder> recorder;
  runner.run([&](int stage, int64_t item) {
    if (hooks.cancel && hooks.cancel->load(std::memory_order_relaxed))
      throw Error("cancelled before this step");
    if (stage == clock_stage && item == warmup) {
      synchronize(device);
      start = Clock::now();
      if (request.gpu_monitor) monitor.start();
    }
    if (stage == clock_stage && profiled > 0 && item == warmup + steps) {
      synchronize(device);
      end = Clock::now();
      monitor.stop();
      recorder = std::make_unique<KernelRecorder>();
    }
    if (stage == clock_stage && profiled > 0 && item == warmup + steps + profiled) {
      synchronize(device);
      result.kernels = recorder->stop(profiled, request.kernel_trace_path);
    }
    if (stage == last_stage) {
      progress.update(item);
      if (hooks.before_train_step) {
        const LaneGuard guard(runner.train_lane(), "before the train step");
        hooks.before_train_step(request.first_step + item);
      }
    }
  });
  synchronize(device);
  monitor.stop();
  progress.finish();
  if (profiled == 0) end = Clock::now();
  result.losses = runner.losses();
  result.timing = runner.timing();
  result.notes = runner.notes();
  result.skipped = runner.skipped();
  set_measurements(result, device, steps, std::chrono::duration<double>(end - start).count(),
                   monitor);
  if (trace) trace->write(request.trace_path);  // throws if the file cannot be written
  return result;
}

}  // namespace tandem::run
