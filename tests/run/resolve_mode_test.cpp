// The choice behind --mode auto, on injected trial timings: fastest wins, noise (the trials' own
// runs' spread, within bounds) favours the simpler mode, failures are skipped, all-failed is an
// error.
#include "tandem/run/resolve_mode.h"

#include <gtest/gtest.h>

namespace tandem::run {
namespace {

Trial ok(const char* mode, double steps_per_s) { return {mode, steps_per_s, "", {steps_per_s}}; }
Trial failed(const char* mode, const std::string& error) { return {mode, std::nullopt, error, {}}; }
Trial runs(const char* mode, std::vector<double> rates) {
  return {mode, trial_rate(rates), "", rates};
}

TEST(ResolveModeTest, PicksTheFastestWhenItWinsByMoreThanTheMargin) {
  const auto d = choose_mode({ok("serial", 100.0), ok("pipelined", 120.0)}, 0.015);
  EXPECT_EQ(d.mode, "pipelined");
  EXPECT_NE(d.reason.find("fastest"), std::string::npos);
}

TEST(ResolveModeTest, PrefersTheSimplerModeWithinTheNoiseMargin) {
  const auto d = choose_mode({ok("serial", 100.0), ok("pipelined", 101.0)}, 0.015);
  EXPECT_EQ(d.mode, "serial");
  EXPECT_NE(d.reason.find("simpler"), std::string::npos);
}

TEST(ResolveModeTest, AnExactTieGoesToTheSimplerMode) {
  EXPECT_EQ(choose_mode({ok("serial", 50.0), ok("pipelined", 50.0)}).mode, "serial");
}

TEST(ResolveModeTest, JustOutsideTheMarginTheFasterModeWins) {
  EXPECT_EQ(choose_mode({ok("serial", 100.0), ok("pipelined", 102.0)}, 0.015).mode, "pipelined");
}

TEST(ResolveModeTest, SkipsAFailedMode) {
  const auto d = choose_mode({failed("serial", "out of memory"), ok("pipelined", 80.0)});
  EXPECT_EQ(d.mode, "pipelined");
}

TEST(ResolveModeTest, ATrialShorterThanItsTimeTargetRunsAgainLonger) {
  // 20 steps at 1000 steps/s took 20 ms: a second trial of 0.6 s worth, capped.
  EXPECT_EQ(second_trial_steps(20, 1000.0, 10000), kAutoTrialMaxSteps);
  EXPECT_EQ(second_trial_steps(20, 100.0, 10000), 60);
  EXPECT_EQ(second_trial_steps(20, 100.0, 45), 45);   // never more than the run itself
  EXPECT_EQ(second_trial_steps(20, 10.0, 10000), 0);  // 2 s already: long enough
  EXPECT_EQ(second_trial_steps(20, 100.0, 20), 0);    // the cap leaves nothing longer
}

TEST(ResolveModeTest, AllModesFailingIsAnErrorThatSaysWhy) {
  try {
    choose_mode({failed("serial", "boom"), failed("pipelined", "bang")});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("serial: boom"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("pipelined: bang"), std::string::npos);
  }
}

TEST(ResolveModeTest, AModeIsRankedByItsSlowestRun) {
  EXPECT_EQ(trial_rate({328.0, 289.0}), 289.0);
  EXPECT_EQ(trial_rate({327.0}), 327.0);
  EXPECT_EQ(trial_rate({}), 0.0);
  // An unsteady mode that was once the fastest loses to a steady one.
  const auto d =
      choose_mode({runs("pipelined", {330.0, 290.0}), runs("pipelined+graphed", {326.0, 327.0})});
  EXPECT_EQ(d.mode, "pipelined+graphed");
}

TEST(ResolveModeTest, SteadyTrialsLetAModeWinBySmallerThanTheFixedMargin) {
  // Serial and graphed each ran twice within 0.1%: graphed's 0.9% is more than their noise.
  const auto d = choose_mode({runs("serial", {2325.0, 2327.0}), runs("graphed", {2347.0, 2346.0})});
  EXPECT_EQ(d.mode, "graphed") << d.reason;
}

TEST(ResolveModeTest, NoisyTrialsKeepTheSimplerModeWithinTheirNoise) {
  // Serial's runs spread 1.2%: graphed's 0.9% lead is within it.
  const auto d = choose_mode({runs("serial", {2325.0, 2353.0}), runs("graphed", {2347.0, 2346.0})});
  EXPECT_EQ(d.mode, "serial");
  EXPECT_NE(d.reason.find("within 1.2%"), std::string::npos) << d.reason;
}

TEST(ResolveModeTest, TheNoiseMarginIsClampedAndNeedsTwoRuns) {
  EXPECT_EQ(run_spread({100.0}), std::nullopt);
  EXPECT_DOUBLE_EQ(*run_spread({90.0, 100.0}), 0.1);
  const Trial steady = runs("serial", {100.0, 100.0});
  const Trial unsteady = runs("pipelined", {90.0, 100.0});
  EXPECT_DOUBLE_EQ(noise_margin(steady, steady, 0.015, 0.005), 0.005);               // the floor
  EXPECT_DOUBLE_EQ(noise_margin(steady, unsteady, 0.015, 0.005), 0.015);             // the ceiling
  EXPECT_DOUBLE_EQ(noise_margin(ok("serial", 100.0), steady, 0.015, 0.005), 0.015);  // unknown
  EXPECT_DOUBLE_EQ(noise_margin(steady, runs("g", {99.0, 100.0}), 0.015, 0.005), 0.01);
}

TEST(ResolveModeTest, ALongRunsAutoIsSettledByTheDeviceWithoutTrials) {
  const ModeResolution gpu = resolve_mode_by_device(std::nullopt, c10::Device("cuda:0"));
  EXPECT_EQ(gpu.mode, Mode::kPipelinedGraphed);
  EXPECT_NE(gpu.decision.reason.find("GPU"), std::string::npos) << gpu.decision.reason;
  EXPECT_TRUE(gpu.trials.empty());
  const ModeResolution cpu = resolve_mode_by_device(std::nullopt, c10::Device("cpu"));
  EXPECT_EQ(cpu.mode, Mode::kSerial);
  const ModeResolution asked = resolve_mode_by_device(Mode::kPipelined, c10::Device("cpu"));
  EXPECT_EQ(asked.mode, Mode::kPipelined);
  EXPECT_EQ(asked.decision.reason, "asked for");
}

TEST(ResolveModeTest, TheRuleWalksTheModesSimplestFirstWhateverTheTrialsOrder) {
  // Timed graphed first (trial_order), listed in that order: serial still wins within noise.
  const auto d = choose_mode({ok("graphed", 101.0), ok("serial", 100.0)});
  EXPECT_EQ(d.mode, "serial") << d.reason;
}

TEST(ResolveModeTest, TheGraphedModesAreTimedFirstPipelinedGraphedFirstOfAll) {
  const auto& order = trial_order();
  ASSERT_EQ(order.size(), workload_modes().size());
  EXPECT_EQ(order.at(0), Mode::kPipelinedGraphed);
  EXPECT_EQ(order.at(1), Mode::kGraphed);
}

TEST(ResolveModeTest, AModeBesideItsGraphedCounterpartThatRanIsNotTimed) {
  EXPECT_EQ(needs_no_trial(Mode::kSerial, {}, true), "");  // nothing known yet
  EXPECT_NE(needs_no_trial(Mode::kSerial, {ok("graphed", 50.0)}, true), "");
  EXPECT_NE(needs_no_trial(Mode::kSerial, {ok("pipelined+graphed", 50.0)}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kSerial, {failed("graphed", "capture failed")}, true), "");
  EXPECT_NE(needs_no_trial(Mode::kPipelined, {ok("pipelined+graphed", 50.0)}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kPipelined, {failed("pipelined+graphed", "no")}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kPipelined, {ok("graphed", 50.0)}, true), "");
}

TEST(ResolveModeTest, GraphedIsTimedBesidePipelinedGraphedOnlyOnAShortStep) {
  EXPECT_EQ(needs_no_trial(Mode::kGraphed, {}, true), "");  // nothing known yet
  const auto slow = needs_no_trial(Mode::kGraphed, {ok("pipelined+graphed", 250.0)}, true);
  EXPECT_NE(slow.find("4.00 ms"), std::string::npos) << slow;  // a 4 ms step: not timed
  EXPECT_EQ(needs_no_trial(Mode::kGraphed, {ok("pipelined+graphed", 2000.0)}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kGraphed, {failed("pipelined+graphed", "no")}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kGraphed, {ok("pipelined+graphed", 250.0)}, true, 0.01), "");
  // graphed_k beside it goes by pipelined+graphed's step where graphed was not timed.
  const std::vector<Trial> untimed_graphed{ok("pipelined+graphed", 250.0),
                                           failed("graphed", "not timed: " + slow)};
  EXPECT_NE(needs_no_trial(Mode::kGraphedK, untimed_graphed, true).find("4.00 ms"),
            std::string::npos);
  EXPECT_EQ(needs_no_trial(Mode::kGraphedK, untimed_graphed, true, 0.01), "");
}

TEST(ResolveModeTest, AStepWithOneStageTimesNoPipelinedMode) {
  for (const Mode m : {Mode::kPipelined, Mode::kPipelinedGraphed}) {
    EXPECT_NE(needs_no_trial(m, {}, false).find("one stage"), std::string::npos);
    EXPECT_EQ(needs_no_trial(m, {}, true), "");
  }
  EXPECT_EQ(needs_no_trial(Mode::kGraphed, {}, false), "");
}

TEST(ResolveModeTest, GraphedKIsTimedOnlyBesideAShortGraphedStep) {
  EXPECT_EQ(needs_no_trial(Mode::kGraphedK, {}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kGraphedK, {ok("graphed", 2000.0)}, true), "");    // 0.5 ms
  const auto slow = needs_no_trial(Mode::kGraphedK, {ok("graphed", 250.0)}, true);  // 4 ms
  EXPECT_NE(slow.find("4.00 ms"), std::string::npos) << slow;
  EXPECT_NE(needs_no_trial(Mode::kGraphedK, {failed("graphed", "no")}, true), "");
  EXPECT_EQ(needs_no_trial(Mode::kGraphedK, {ok("graphed", 250.0)}, true, 0.01), "");
}

// The one rule of which modes a job allows: a run folder rules out graphed_k alone; a graph
// needs an optimizer without host-side state, and under a schedule on CUDA one that reads its
// lr from the device; the front end's advice ends the message.
TEST(ModeProblemTest, ARunFolderRulesOutGraphedKAlone) {
  ModeConstraints folder;
  folder.run_folder = true;
  for (const Mode m : workload_modes())
    EXPECT_EQ(mode_problem(m, folder).empty(), m != Mode::kGraphedK) << to_string(m);
  EXPECT_NE(mode_problem(Mode::kGraphedK, folder).find("run folder"), std::string::npos);
  EXPECT_EQ(mode_problem(Mode::kGraphedK, ModeConstraints{}), "");
}

TEST(ModeProblemTest, AGraphNeedsACapturableOptimizerAndUnderAScheduleAnLrOnTheDevice) {
  ModeConstraints c;
  c.capturable = false;
  c.optimizer = "Adam";
  c.capturable_advice = "make it capturable";
  for (const Mode m : workload_modes()) {
    const std::string why = mode_problem(m, c);
    EXPECT_EQ(why.empty(), !captures_graphs(m)) << to_string(m);
    if (!why.empty()) {
      EXPECT_NE(why.find("Adam keeps host-side state"), std::string::npos) << why;
      EXPECT_NE(why.find("make it capturable, or mode 'pipelined'"), std::string::npos) << why;
    }
  }
  ModeConstraints schedule;
  schedule.lr_schedule_on_host = true;
  EXPECT_EQ(mode_problem(Mode::kGraphed, schedule), "");  // no graph replays off CUDA
  schedule.cuda = true;
  EXPECT_NE(mode_problem(Mode::kGraphed, schedule).find("float lr"), std::string::npos);
  EXPECT_EQ(mode_problem(Mode::kPipelined, schedule), "");
}

}  // namespace
}  // namespace tandem::run
