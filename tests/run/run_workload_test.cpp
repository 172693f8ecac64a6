// The run layer on the CPU (reference workload mlp, a few steps): a request's fields reach the
// core's options once, each hook is called where it says, a cancel stops the run, and
// resolve_mode keeps a named mode and picks one of the trials' modes for auto.
#include "tandem/run/run_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tandem/run/resolve_mode.h"
#include "tandem/workloads/registry.h"

namespace tandem::run {
namespace {

RunRequest small_mlp_request() {
  RunRequest r;
  r.workload = find_reference_workload("mlp");
  r.device = "cpu";
  r.steps = 3;
  r.warmup = 1;
  r.workers = 1;
  r.progress = false;
  r.gpu_monitor = false;
  return r;
}

TEST(RunRequestTest, TheCoreOptionsCarryTheRequestsFields) {
  RunRequest r = small_mlp_request();
  r.batch_size = 6;
  r.seed = 11;
  r.rank = 1;
  r.world_size = 2;
  r.skip_bad = true;
  r.first_step = 40;
  r.train_priority = "normal";
  r.input_priority = "high";
  r.mode = Mode::kPipelined;
  r = resolve(r);
  const WorkloadOptions wo = workload_options(r);
  EXPECT_EQ(wo.batch_size, 6);
  EXPECT_EQ(wo.workers, 1);
  EXPECT_EQ(wo.seed, 11u);
  EXPECT_EQ(wo.rank, 1);
  EXPECT_EQ(wo.world_size, 2);
  EXPECT_TRUE(wo.device.is_cpu());
  const RunOptions ro = runner_options(r);
  EXPECT_EQ(ro.mode, Mode::kPipelined);
  EXPECT_EQ(ro.batch_size, 6);
  EXPECT_EQ(ro.seed, 11u);
  EXPECT_EQ(ro.rank, 1);
  EXPECT_EQ(ro.world_size, 2);
  EXPECT_TRUE(ro.skip_bad);
  EXPECT_EQ(ro.first_step, 40);
  EXPECT_EQ(ro.train_priority, LanePriority::kNormal);
  EXPECT_EQ(ro.input_priority, LanePriority::kHigh);
}

TEST(RunRequestTest, TheLoaderWorkersHaveOneDefaultForEveryFrontEnd) {
  // On the CPU 2; on a GPU the cores less one, at most 15 (no launch: one rank here).
  EXPECT_EQ(default_loader_workers(c10::Device("cpu")), 2);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(default_loader_workers(c10::Device("cuda")), std::max(1, std::min(15, cores - 1)));
  EXPECT_EQ(default_loader_workers(c10::Device("cuda"), 1), 1);
  RunRequest r = small_mlp_request();
  r.workers.reset();
  EXPECT_EQ(resolve(r).workers, default_loader_workers(c10::Device(resolve(r).device)));
}

TEST(RunRequestTest, ResolveNamesABadValue) {
  RunRequest r = small_mlp_request();
  r.workers = 0;
  EXPECT_THROW(
      {
        try {
          resolve(r);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("worker count 0 is not valid"), std::string::npos)
              << e.what();
          throw;
        }
      },
      InvalidArgument);
}

TEST(RunRequestTest, ResolveNamesABadCudaWait) {
  RunRequest r = small_mlp_request();
  r.cuda_wait = "nap";
  try {
    resolve(r);
    FAIL() << "cuda_wait 'nap' was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "CUDA wait 'nap' is not valid: expected auto, spin, yield or block");
  }
  r.cuda_wait = "block";
  EXPECT_EQ(resolve(r).cuda_wait, "block");
}

TEST(RunWorkloadTest, HooksAreCalledOncePerInstanceAndBeforeEveryTrainStep) {
  RunRequest r = small_mlp_request();
  r.mode = Mode::kPipelined;
  r.first_step = 100;
  int prepared = 0;
  std::vector<int64_t> steps;
  RunHooks hooks;
  hooks.prepare_workload = [&](Workload& w) {
    ++prepared;
    EXPECT_EQ(w.name, "mlp");
  };
  hooks.before_train_step = [&](int64_t step) { steps.push_back(step); };
  const RunReport report = run_workload(r, hooks);
  EXPECT_EQ(prepared, 1);
  EXPECT_EQ(steps, (std::vector<int64_t>{100, 101, 102, 103}));  // warm-up included
  EXPECT_EQ(report.losses.size(), 4u);
  EXPECT_GT(report.steps_per_s, 0.0);
  EXPECT_EQ(report.request.mode, Mode::kPipelined);
  EXPECT_EQ(report.device_name, "cpu");
  const nlohmann::json j = to_json(report);
  EXPECT_EQ(j.at("mode"), "pipelined");
  EXPECT_EQ(j.at("losses").size(), 4u);
  EXPECT_NE(describe_report(report).find("mlp"), std::string::npos);
}

TEST(RunWorkloadTest, ACancelStopsTheRunWithARunError) {
  RunRequest r = small_mlp_request();
  std::atomic<bool> cancel{true};
  RunHooks hooks;
  hooks.cancel = &cancel;
  try {
    run_workload(r, hooks);
    FAIL() << "a cancelled run returned";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
}

TEST(RunWorkloadTest, ModeAutoIsRefusedUntilResolved) {
  RunRequest r = small_mlp_request();
  r.mode = std::nullopt;
  EXPECT_THROW(run_workload(r), InvalidArgument);
}

TEST(RunModeTest, AutoIsTheRunLayersModeBesideTheCoresOnes) {
  EXPECT_EQ(parse_run_mode("auto"), std::nullopt);
  EXPECT_EQ(parse_run_mode("graphed"), RunMode(Mode::kGraphed));
  EXPECT_EQ(mode_name(std::nullopt), "auto");
  EXPECT_EQ(mode_name(Mode::kPipelinedGraphed), "pipelined+graphed");
  EXPECT_EQ(run_modes().size(), workload_modes().size() + 1);
  EXPECT_FALSE(run_modes().back().has_value());
  try {
    parse_run_mode("fast");
    FAIL() << "an unknown mode was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "mode 'fast' is not valid: expected serial, pipelined, graphed, "
                 "pipelined+graphed, graphed_k or auto");
  }
}

TEST(ResolveModeRunTest, ARuledOutModeAskedForIsRefusedWithItsReason) {
  RunRequest r = small_mlp_request();
  r.mode = Mode::kGraphed;
  r.ruled_out[Mode::kGraphed] = "no graphs for this optimizer";
  EXPECT_THROW(resolve_mode(r), InvalidArgument);
}

TEST(ResolveModeRunTest, ANamedModeIsKeptWithoutTrials) {
  RunRequest r = small_mlp_request();
  r.mode = Mode::kGraphed;
  const ModeResolution m = resolve_mode(r);
  EXPECT_EQ(m.mode, Mode::kGraphed);
  EXPECT_EQ(m.decision.reason, "asked for");
  EXPECT_TRUE(m.trials.empty());
}

TEST(ResolveModeRunTest, AutoListsEveryModeAndPicksOneThatRan) {
  RunRequest r = small_mlp_request();
  r.mode = std::nullopt;  // auto
  r.steps = 2;            // the trials' cap: no longer second trials
  r.ruled_out[Mode::kPipelined] = "pipelined is not for this run";
  const ModeResolution m = resolve_mode(r);
  ASSERT_EQ(m.trials.size(), workload_modes().size());
  EXPECT_NE(m.mode, Mode::kPipelined);
  EXPECT_EQ(m.trials.at(1).mode, "pipelined");
  EXPECT_EQ(m.trials.at(1).error, "pipelined is not for this run");
  EXPECT_FALSE(m.trials.at(1).steps_per_s.has_value());
  // Timed first, pipelined+graphed ran this step from its graphs: serial, which a graphed mode
  // replays, is not timed; graphed only beside a short pipelined+graphed step.
  ASSERT_TRUE(m.trials.at(3).steps_per_s.has_value()) << m.trials.at(3).error;
  EXPECT_TRUE(m.trials.at(2).steps_per_s.has_value() ||
              m.trials.at(2).error.rfind("not timed: pipelined+graphed's step takes", 0) == 0)
      << m.trials.at(2).error;
  EXPECT_EQ(m.trials.at(0).error.rfind("not timed: ", 0), 0u) << m.trials.at(0).error;
  EXPECT_NE(m.trials.at(0).error.find("graphed replays"), std::string::npos)
      << m.trials.at(0).error;
  bool picked_ran = false;
  for (const Trial& t : m.trials)
    if (t.mode == to_string(m.mode)) picked_ran = t.steps_per_s.has_value();
  EXPECT_TRUE(picked_ran) << m.decision.reason;
  const nlohmann::json j = to_json(m);
  EXPECT_EQ(j.at("picked"), to_string(m.mode));
  EXPECT_EQ(j.at("trials").size(), m.trials.size());
  EXPECT_GT(m.trial_seconds, 0.0);
}

}  // namespace
}  // namespace tandem::run
