// Modes: one table names, describes and parses them; help and error texts come from it.
#include "tandem/mode.h"

#include <gtest/gtest.h>

#include "tandem/error.h"

namespace tandem {
namespace {

TEST(ModeTest, EveryModeParsesFromItsOwnName) {
  for (const Mode m : workload_modes()) {
    EXPECT_EQ(parse_mode(to_string(m)), m) << to_string(m);
    EXPECT_STRNE(describe(m), "") << to_string(m);
  }
}

TEST(ModeTest, WorkloadModesAreSimplestFirst) {
  const auto& modes = workload_modes();
  ASSERT_EQ(modes.size(), 5u);
  EXPECT_EQ(modes.front(), Mode::kSerial);  // the baseline
}

TEST(ModeTest, AutoIsNotACoreMode) {
  EXPECT_THROW(parse_mode("auto"), InvalidArgument);  // the run layer's (run/request.h)
}

TEST(ModeTest, ABadNameIsRejectedWithEveryValidOne) {
  try {
    parse_mode("gpu_aug");
    FAIL() << "an unknown mode was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "mode 'gpu_aug' is not valid: expected serial, pipelined, graphed, "
                 "pipelined+graphed or graphed_k");
  }
}

TEST(ModeTest, PipelinedAndGraphedModesAreClassified) {
  EXPECT_FALSE(runs_pipelined(Mode::kSerial));
  EXPECT_TRUE(runs_pipelined(Mode::kPipelined));
  EXPECT_TRUE(runs_pipelined(Mode::kPipelinedGraphed));
  EXPECT_FALSE(runs_pipelined(Mode::kGraphedK));
  EXPECT_FALSE(captures_graphs(Mode::kPipelined));
  EXPECT_TRUE(captures_graphs(Mode::kGraphed));
  EXPECT_TRUE(captures_graphs(Mode::kGraphedK));
  EXPECT_EQ(mode_choices(), "serial, pipelined, graphed, pipelined+graphed or graphed_k");
}

TEST(ModeTest, JoinChoicesReadsAsAList) {
  EXPECT_EQ(join_choices({}), "");
  EXPECT_EQ(join_choices({"a"}), "a");
  EXPECT_EQ(join_choices({"a", "b"}), "a or b");
  EXPECT_EQ(join_choices({"a", "b", "c"}), "a, b or c");
}

}  // namespace
}  // namespace tandem
