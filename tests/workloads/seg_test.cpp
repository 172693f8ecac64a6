// The seg workload: model definitions as docs/reference-workloads.md states them, and pipelined and
// graphed training computing exactly what serial training computes (losses and final weights), on
// the CPU and the GPU; a short last batch runs eagerly in the graphed modes, and the notes say what
// happened.
#include "tandem/workloads/seg.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tandem/error.h"
#include "tandem/models/reference_nets.h"
#include "tandem/runner.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::has;

int64_t count_parameters(torch::nn::Sequential& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(SegTest, ParameterCountsMatchTheReferenceNets) {
  auto enc = models::reference_seg_encoder();
  auto dec = models::reference_seg_decoder();
  EXPECT_EQ(count_parameters(enc), 44746784);
  EXPECT_EQ(count_parameters(dec), 44744090);
}

TEST(SegTest, ShapesFlowFromImageToPerPixelLogits) {
  at::NoGradGuard no_grad;
  auto enc = models::reference_seg_encoder();
  auto dec = models::reference_seg_decoder();
  const at::Tensor x = at::rand({1, 3, 256, 256});
  const at::Tensor f = enc->forward(x);
  EXPECT_EQ(f.sizes(), (at::IntArrayRef{1, 4096, 1, 1}));
  EXPECT_EQ(dec->forward(f).sizes(), (at::IntArrayRef{1, 10, 256, 256}));
}

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> weights;
  std::vector<std::string> notes;
};

Trained train(const std::string& mode, c10::Device device, int64_t batch_size, int64_t steps,
              int64_t last_batch_size = 0) {
  WorkloadOptions wo;
  wo.batch_size = batch_size;
  wo.seed = 1234;
  wo.device = device;
  SegWorkload seg = make_seg(wo);
  RunOptions o;
  o.mode = parse_mode(mode);
  o.batch_size = batch_size;
  o.workers = 3;
  o.last_batch_size = last_batch_size;
  Runner runner(seg.workload, o);
  Trained t;
  t.losses = runner.train(steps);
  for (const auto& p : seg.decoder->parameters()) t.weights.push_back(p.detach().cpu());
  t.notes = runner.notes();
  return t;
}

/// The notes joined into one line, for searching and for failure messages.
std::string joined(const std::vector<std::string>& notes) {
  std::string out;
  for (const auto& n : notes) out += n + " | ";
  return out;
}

void expect_same_training(const Trained& serial, const Trained& pipelined) {
  ASSERT_EQ(serial.losses.size(), pipelined.losses.size());
  for (size_t i = 0; i < serial.losses.size(); ++i)
    ASSERT_EQ(serial.losses[i], pipelined.losses[i]) << "first differing loss at step " << i;
  ASSERT_EQ(serial.weights.size(), pipelined.weights.size());
  for (size_t i = 0; i < serial.weights.size(); ++i)
    ASSERT_TRUE(serial.weights[i].equal(pipelined.weights[i])) << "decoder parameter " << i;
  // The run really trained: losses are finite, vary, and weights moved away from the start.
  EXPECT_NE(serial.losses.front(), serial.losses.back());
  for (float l : serial.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(SegTest, PipelinedTrainsExactlyLikeSerialOnCpu) {
  testing::use_deterministic_algorithms();
  const auto serial = train("serial", c10::Device(c10::kCPU), 1, 20);
  const auto pipelined = train("pipelined", c10::Device(c10::kCPU), 1, 20);
  expect_same_training(serial, pipelined);
}

TEST(SegGpuTest, PipelinedTrainsExactlyLikeSerial) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto serial = train("serial", cuda, 4, 24);
  const auto pipelined = train("pipelined", cuda, 4, 24);
  expect_same_training(serial, pipelined);
}

TEST(SegTest, GraphedModesRunEagerlyOnTheCpuAndTrainLikeSerial) {
  testing::use_deterministic_algorithms();
  const c10::Device cpu(c10::kCPU);
  // A short last batch (1 of 2) too: the CPU runs it like every other batch.
  const auto serial = train("serial", cpu, 2, 4, /*last_batch_size=*/1);
  for (const std::string mode : {"graphed", "pipelined+graphed"}) {
    SCOPED_TRACE(mode);
    const auto graphed = train(mode, cpu, 2, 4, 1);
    expect_same_training(serial, graphed);
    ASSERT_EQ(graphed.notes.size(), 1u) << joined(graphed.notes);
    EXPECT_EQ(graphed.notes[0],
              "CUDA graphs need a CUDA device: mode " + mode + " ran eagerly on the CPU");
  }
  EXPECT_TRUE(serial.notes.empty()) << joined(serial.notes);
}

// Bitwise, losses and final weights: the graphs replay the very kernels of the eager step (the
// statics take the eager tensors' shapes and strides, cuDNN's plan cache is filled by the warm-up
// steps, deterministic algorithms are on), and the inputs are copied, not recomputed.
TEST(SegGpuTest, GraphedModesTrainExactlyLikeSerial) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto serial = train("serial", cuda, 4, 24);
  const auto graphed = train("graphed", cuda, 4, 24);
  expect_same_training(serial, graphed);
  const std::string notes = joined(graphed.notes);
  EXPECT_TRUE(has(notes,
                  "captured: step (encode: uint8->float, frozen encoder; train: decoder "
                  "forward, cross-entropy, backward, tandem::optim::Sgd step) as one graph "
                  "after 3 eager warm-up steps"))
      << notes;
  EXPECT_TRUE(has(notes, "; 21 replays |")) << notes;  // steps 3..23
  EXPECT_TRUE(has(notes, "load (loader and H2D copy) stays eager")) << notes;
  EXPECT_FALSE(has(notes, "ran eagerly")) << notes;

  const auto both = train("pipelined+graphed", cuda, 4, 24);
  expect_same_training(serial, both);
  const std::string both_notes = joined(both.notes);
  EXPECT_TRUE(has(both_notes,
                  "captured: encode (encode: uint8->float, frozen encoder) as one "
                  "graph on lane encoder after 3 eager warm-up steps on a side lane; "
                  "21 replays"))
      << both_notes;
  EXPECT_TRUE(has(both_notes,
                  "captured: train (train: decoder forward, cross-entropy, backward, "
                  "tandem::optim::Sgd step) as one graph on lane decoder"))
      << both_notes;
  EXPECT_FALSE(has(both_notes, "ran eagerly")) << both_notes;
}

TEST(SegGpuTest, AShortLastBatchRunsEagerlyInTheGraphedModes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();
  const c10::Device cuda(c10::kCUDA, 0);
  const auto serial = train("serial", cuda, 4, 8, /*last_batch_size=*/3);
  for (const std::string mode : {"graphed", "pipelined+graphed"}) {
    SCOPED_TRACE(mode);
    const auto graphed = train(mode, cuda, 4, 8, 3);
    expect_same_training(serial, graphed);
    const std::string notes = joined(graphed.notes);
    EXPECT_TRUE(has(notes, "step 7 ran eagerly")) << notes;
    EXPECT_TRUE(has(notes, "input 0 is [3, 3, 256, 256], captured [4, 3, 256, 256]")) << notes;
    EXPECT_TRUE(has(notes, "; 4 replays |")) << notes;
  }
}

TEST(SegGpuTest, ARunShorterThanTheWarmUpRunsEagerlyAndSaysSo) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const auto t = train("graphed", c10::Device(c10::kCUDA, 0), 2, 2);
  const std::string notes = joined(t.notes);
  EXPECT_TRUE(has(notes,
                  "seg step: all 2 step(s) ran eagerly: a graph is captured only after 3 "
                  "warm-up steps"))
      << notes;
  EXPECT_FALSE(has(notes, "captured:")) << notes;
}

TEST(SegTest, RejectsALastBatchSizeThatIsNotShort) {
  RunOptions o;
  o.batch_size = 2;
  o.last_batch_size = 2;
  try {
    Runner runner(make_seg({}).workload, o);
    FAIL() << "a last batch as large as the batch size was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "last batch size 2 is not valid")) << e.what();
  }
}

TEST(SegTest, RejectsParametersItDoesNotTake) {
  WorkloadOptions wo;
  wo.params["augment"] = "cpu";
  EXPECT_THROW(make_seg(wo), InvalidArgument);
}

}  // namespace
}  // namespace tandem
