// The runner on a workload defined in this file — proof that a new workload needs no library
// change: every mode computes the serial loop's losses and weights; validation names the bad
// part; a stage's failure stops the run with one line naming the stage, mode and batch size;
// data sources (a dataset over several epochs, resident batches) and LibTorch's optimizers work
// where they may, and are refused clearly where they may not.
#include "tandem/runner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <stdexcept>

#include "tandem/detail/autocast.h"
#include "tandem/error.h"
#include "tandem/torch_optimizer.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::has;
using test_support::kCpu;
using test_support::kCuda;

constexpr int64_t kIn = 8, kHidden = 16, kClasses = 3;

/// x: (8,) float, a smooth function of the index; label: index % 3, learnable from x.
class ToyDataset : public Dataset {
 public:
  explicit ToyDataset(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override {
    return {{"x", {kIn}, at::kFloat}, {"label", {}, at::kLong}};
  }
  void get(int64_t index, const std::vector<at::Tensor>& out) const override {
    const int64_t label = index % kClasses;
    float* x = out[0].data_ptr<float>();
    for (int64_t j = 0; j < kIn; ++j)
      x[j] = std::sin(0.37f * static_cast<float>(index * kIn + j)) + (j == label ? 1.5f : 0.f);
    *out[1].data_ptr<int64_t>() = label;
  }

 private:
  int64_t size_;
};

struct Toy {
  Workload workload;
  torch::nn::Linear backbone{nullptr}, head{nullptr};
};

/// The toy's head trained in fp16 (autocast) with `scale` as its loss scale (none: unscaled).
Toy in_fp16(Toy t, std::shared_ptr<LossScale> scale) {
  const c10::Device device = t.workload.device;
  auto head = t.head.ptr();
  t.workload.train.loss = [head, device](const Tensors& in) {
    AutocastScope autocast(device, Precision::kFp16);
    return at::cross_entropy_loss(head->forward(in[0]).to(at::kFloat), in[1], {},
                                  at::Reduction::None)
        .mean();
  };
  t.workload.train.loss_scale = std::move(scale);
  return t;
}

enum class Opt { kTandemSgd, kLibTorchSgd, kAdamW };

/// A frozen backbone feed ("features" from "x") and a trainable head.
Toy make_toy(c10::Device device, Opt opt = Opt::kTandemSgd) {
  torch::manual_seed(3);
  Toy t;
  t.backbone = torch::nn::Linear(kIn, kHidden);
  t.head = torch::nn::Linear(kHidden, kClasses);
  t.backbone->to(device);
  t.head->to(device);
  for (auto& p : t.backbone->parameters()) p.set_requires_grad(false);
  Workload& w = t.workload;
  w.name = "toy";
  w.device = device;
  w.data = DataSource::sized_to_run(
      [](int64_t samples) { return std::make_shared<ToyDataset>(samples); });
  auto backbone = t.backbone.ptr();
  auto head = t.head.ptr();
  w.feeds.push_back(
      {"backbone",
       "",
       {"x"},
       {"features"},
       [backbone](const Tensors& in) { return Tensors{backbone->forward(in[0]).relu()}; },
       "frozen linear",
       {}});
  w.train.inputs = {"features", "label"};
  w.train.loss = [head](const Tensors& in) {
    return at::cross_entropy_loss(head->forward(in[0]), in[1], {}, at::Reduction::None).mean();
  };
  if (opt == Opt::kTandemSgd) {
    w.train.optimizer = std::make_shared<optim::Sgd>(t.head->parameters(), 0.1);
  } else if (opt == Opt::kAdamW) {
    w.train.optimizer =
        std::make_shared<optim::Adam>(t.head->parameters(), optim::AdamOptions::adamw(0.01));
  } else {
    w.train.optimizer = std::make_shared<optim::LibTorchOptimizer>(
        std::make_shared<torch::optim::SGD>(t.head->parameters(), torch::optim::SGDOptions(0.1)),
        "torch::optim::SGD");
  }
  return t;
}

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> weights;
  std::vector<std::string> notes;
  RunSetup setup;
};

Trained train(Toy toy, Mode mode, int64_t steps, int64_t batch = 4, int64_t last = 0) {
  RunOptions o;
  o.mode = mode;
  o.batch_size = batch;
  o.workers = 2;
  o.last_batch_size = last;
  Runner runner(toy.workload, o);
  Trained t;
  t.losses = runner.train(steps);
  for (const auto& p : toy.head->parameters()) t.weights.push_back(p.detach().cpu());
  t.notes = runner.notes();
  t.setup = runner.setup();
  return t;
}

void expect_same(const Trained& want, const Trained& got, const std::string& what) {
  ASSERT_EQ(want.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    ASSERT_EQ(want.losses[i], got.losses[i]) << what << ": first differing loss at step " << i;
  ASSERT_EQ(want.weights.size(), got.weights.size());
  for (size_t i = 0; i < want.weights.size(); ++i)
    ASSERT_TRUE(want.weights[i].equal(got.weights[i])) << what << ": head parameter " << i;
}

std::string joined(const std::vector<std::string>& notes) {
  std::string out;
  for (const auto& n : notes) out += n + " | ";
  return out;
}

TEST(RunnerTest, EveryModeTrainsExactlyLikeSerialOnCpu) {
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_toy(kCpu), Mode::kSerial, 12, 4, /*last=*/3);
  ASSERT_EQ(serial.losses.size(), 12u);
  for (float l : serial.losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(serial.losses.back(), serial.losses.front());  // it learns
  EXPECT_TRUE(serial.notes.empty()) << joined(serial.notes);
  for (const Mode mode : workload_modes()) {
    const Trained got = train(make_toy(kCpu), mode, 12, 4, 3);
    expect_same(serial, got, to_string(mode));
    if (captures_graphs(mode)) {
      ASSERT_EQ(got.notes.size(), 1u) << joined(got.notes);
      EXPECT_EQ(got.notes[0], std::string("CUDA graphs need a CUDA device: mode ") +
                                  to_string(mode) + " ran eagerly on the CPU");
    }
  }
}

TEST(RunnerTest, TheSetupSaysWhatTheRunPaidBesidesItsSteps) {
  // On the CPU every mode runs eagerly: the run's start is timed, no graph is captured.
  for (const Mode mode : {Mode::kSerial, Mode::kPipelinedGraphed}) {
    const Trained t = train(make_toy(kCpu), mode, 6);
    EXPECT_GT(t.setup.prepare_seconds, 0) << to_string(mode);
    EXPECT_LT(t.setup.prepare_seconds, 60) << to_string(mode);
    EXPECT_EQ(t.setup.graphs, 0) << to_string(mode);
    EXPECT_EQ(t.setup.capture_seconds, 0) << to_string(mode);
  }
}

TEST(RunnerTest, AdamWTrainsAlikeInEveryMode) {
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_toy(kCpu, Opt::kAdamW), Mode::kSerial, 8);
  for (const Mode mode : workload_modes())
    expect_same(serial, train(make_toy(kCpu, Opt::kAdamW), mode, 8), to_string(mode));
}

// fp16 with a dynamic loss scale: every mode gives serial's losses and weights; a scale of 1
// changes nothing against the unscaled fp16 run (the same bits); steps whose gradients overflow
// are skipped (a scale far beyond fp16's range: no step applies, the scale backs off at each).
TEST(RunnerTest, Fp16WithALossScaleTrainsAlikeInEveryModeAndSkipsOverflowedSteps) {
  testing::use_deterministic_algorithms();
  auto scaled = [](Opt opt, LossScaleOptions o = {}) {
    return in_fp16(make_toy(kCpu, opt), std::make_shared<LossScale>(kCpu, o));
  };
  for (const Opt opt : {Opt::kTandemSgd, Opt::kAdamW}) {
    const Trained serial = train(scaled(opt), Mode::kSerial, 10);
    for (float l : serial.losses) ASSERT_TRUE(std::isfinite(l));
    EXPECT_LT(serial.losses.back(), serial.losses.front());  // it learns
    for (const Mode mode : workload_modes())
      expect_same(serial, train(scaled(opt), mode, 10), to_string(mode));

    LossScaleOptions one;
    one.init_scale = 1;
    expect_same(train(in_fp16(make_toy(kCpu, opt), nullptr), Mode::kSerial, 10),
                train(scaled(opt, one), Mode::kSerial, 10), "a loss scale of 1");
  }
  LossScaleOptions huge;
  huge.init_scale = 1e30;  // float32 still, but every fp16 gradient overflows
  Toy toy = scaled(Opt::kTandemSgd, huge);
  const auto scale = toy.workload.train.loss_scale;
  std::vector<at::Tensor> before;
  for (const auto& p : toy.head->parameters()) before.push_back(p.detach().clone());
  const Trained skipped = train(toy, Mode::kPipelined, 6);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(skipped.weights[i].equal(before[i])) << "head parameter " << i << " moved";
  EXPECT_EQ(scale->scale(), static_cast<double>(static_cast<float>(1e30)) / 64)
      << "backed off once a step";
}

TEST(RunnerTest, ALossScaleNeedsAnOptimizerThatSkipsOnTheDevice) {
  Toy toy = in_fp16(make_toy(kCpu, Opt::kLibTorchSgd), std::make_shared<LossScale>(kCpu));
  try {
    RunOptions o;
    o.mode = Mode::kSerial;
    Runner runner(toy.workload, o);
    ADD_FAILURE() << "a LibTorch optimizer cannot skip an overflowed step on the device";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("torch::optim::SGD cannot skip a step on the device"),
              std::string::npos)
        << e.what();
  }
}

TEST(RunnerTest, ALibTorchOptimizerRunsEagerModesAndIsRefusedByGraphedOnes) {
  testing::use_deterministic_algorithms();
  const Trained ours = train(make_toy(kCpu), Mode::kSerial, 6);
  const Trained theirs = train(make_toy(kCpu, Opt::kLibTorchSgd), Mode::kPipelined, 6);
  ASSERT_EQ(ours.losses.size(), theirs.losses.size());
  for (size_t i = 0; i < ours.losses.size(); ++i)
    EXPECT_NEAR(ours.losses[i], theirs.losses[i], 1e-5) << "step " << i;
  for (const Mode mode : {Mode::kGraphed, Mode::kPipelinedGraphed, Mode::kGraphedK}) {
    RunOptions o;
    o.mode = mode;
    try {
      Runner runner(make_toy(kCpu, Opt::kLibTorchSgd).workload, o);
      FAIL() << to_string(mode) << " accepted a LibTorch optimizer";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(
          has(e.what(), std::string("mode ") + to_string(mode) + " captures train stage 'train'"))
          << e.what();
      EXPECT_TRUE(has(e.what(), "torch::optim::SGD")) << e.what();
    }
  }
}

TEST(RunnerTest, AStageThatMustStayEagerIsAllowedEverywhere) {
  Toy toy = make_toy(kCpu, Opt::kLibTorchSgd);
  toy.workload.train.capture = Capture::kNever;  // its optimizer keeps host state: eager it is
  RunOptions o;
  o.mode = Mode::kPipelinedGraphed;
  o.batch_size = 2;
  Runner runner(toy.workload, o);
  EXPECT_EQ(runner.train(3).size(), 3u);
  o.mode = Mode::kGraphedK;
  EXPECT_THROW(Runner(toy.workload, o), InvalidArgument);  // K steps per graph: all captured
}

TEST(RunnerTest, AFieldNoStageProvidesIsNamedWithWhatThereIs) {
  Toy toy = make_toy(kCpu);
  toy.workload.train.inputs = {"feature", "label"};
  try {
    Runner runner(toy.workload, {});
    FAIL() << "a train stage reading a missing field was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "stage 'train' of workload 'toy' reads field 'feature', which neither the data "
                 "source nor an earlier stage provides: expected one of x, label or features");
  }
}

TEST(RunnerTest, IncompleteWorkloadsAreRefusedByName) {
  Toy a = make_toy(kCpu);
  a.workload.train.optimizer = nullptr;
  EXPECT_THROW(Runner(a.workload, {}), InvalidArgument);
  Toy b = make_toy(kCpu);
  b.workload.feeds[0].name = "train";
  try {
    Runner runner(b.workload, {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "two stages named 'train'")) << e.what();
  }
  Workload empty;
  EXPECT_THROW(Runner(empty, {}), InvalidArgument);
  RunOptions o;
  o.workers = 100000;
  try {
    Runner runner(make_toy(kCpu).workload, o);
    FAIL() << "100000 workers were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "worker count 100000 is not valid")) << e.what();
  }
}

TEST(RunnerTest, AFailingStageStopsTheRunAndSaysWhereInOneLine) {
  for (const Mode mode : workload_modes()) {
    SCOPED_TRACE(to_string(mode));
    Toy toy = make_toy(kCpu);
    const StageFn fn = toy.workload.feeds[0].fn;
    auto calls = std::make_shared<std::atomic<int>>(0);
    toy.workload.feeds[0].fn = [fn, calls](const Tensors& in) -> Tensors {
      if (++*calls == 3) throw std::runtime_error("boom\nsecond line");
      return fn(in);
    };
    RunOptions o;
    o.mode = mode;
    o.batch_size = 4;
    o.workers = 2;
    auto done = std::async(std::launch::async, [&] {
      Runner runner(toy.workload, o);
      try {
        runner.train(20);
      } catch (const RunError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    });
    // Not a timing threshold: a bound that turns a hang into a failure instead of a stuck run.
    ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "hung";
    const std::string what = done.get();
    // The graphed modes run the backbone and the train step as one stage, "step".
    const bool merged = mode == Mode::kGraphed || mode == Mode::kGraphedK;
    EXPECT_TRUE(has(what, merged ? "stage 'step' (lane serial)" : "stage 'backbone' (lane "))
        << what;
    EXPECT_TRUE(has(what, std::string(" in mode ") + to_string(mode) + " at batch size 4: boom"))
        << what;
    EXPECT_FALSE(has(what, "second line")) << what;
  }
}

TEST(RunnerTest, AFeedReturningTheWrongNumberOfTensorsIsNamed) {
  Toy toy = make_toy(kCpu);
  toy.workload.feeds[0].fn = [](const Tensors& in) { return Tensors{in[0], in[0]}; };
  Runner runner(toy.workload, {});
  try {
    runner.train(1);
    FAIL();
  } catch (const RunError& e) {
    EXPECT_TRUE(has(e.what(), "feed stage 'backbone' returned 2 tensors: expected 1")) << e.what();
  }
}

TEST(RunnerTest, ADatasetRunsOverSeveralShuffledEpochsAlikeInEveryMode) {
  testing::use_deterministic_algorithms();
  auto make = [] {
    Toy t = make_toy(kCpu);
    t.workload.data = DataSource::from_dataset(std::make_shared<ToyDataset>(10),
                                               /*shuffle=*/true, /*drop_last=*/true);
    return t;
  };
  // 10 samples make 2 batches of 4 per epoch (drop_last): 7 steps span 4 epochs.
  const Trained serial = train(make(), Mode::kSerial, 7);
  ASSERT_EQ(serial.losses.size(), 7u);
  for (const Mode mode : workload_modes())
    expect_same(serial, train(make(), mode, 7), to_string(mode));
  // Shuffled per epoch: epoch 1's first batch is not epoch 0's.
  EXPECT_NE(serial.losses[0], serial.losses[2]);
}

// The data source's worker nice value reaches the loader: the same losses at 5, and one out of
// range refused when the runner is made, naming it, before any worker starts.
TEST(RunnerTest, TheSourcesWorkerNiceValueReachesTheLoader) {
  testing::use_deterministic_algorithms();
  auto make = [](int nice) {
    Toy t = make_toy(kCpu);
    t.workload.data = DataSource::from_dataset(std::make_shared<ToyDataset>(10), /*shuffle=*/true,
                                               /*drop_last=*/true)
                          .with_worker_nice(nice);
    return t;
  };
  const Trained plain = train(make(0), Mode::kPipelined, 5);
  expect_same(plain, train(make(5), Mode::kPipelined, 5), "worker_nice 5");
  Toy bad = make(25);
  try {
    Runner(bad.workload, RunOptions{});
    FAIL() << "a nice value of 25 was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "loader worker nice value 25 is not valid: expected 0 to 19"))
        << e.what();
  }
}

/// The toy on `batches` resident batches of 5 samples each (step i trains on batch i % n).
Toy make_resident_toy(c10::Device device, int batches = 3) {
  Toy t = make_toy(device);
  std::vector<Batch> out(static_cast<size_t>(batches));
  for (int i = 0; i < batches; ++i) {
    std::vector<at::Tensor> fields{at::empty({5, kIn}), at::empty({5}, at::kLong)};
    ToyDataset d(5 * batches);
    for (int64_t s = 0; s < 5; ++s) d.get(i * 5 + s, {fields[0][s], fields[1][s]});
    out[static_cast<size_t>(i)].set("x", fields[0].to(device));
    out[static_cast<size_t>(i)].set("label", fields[1].to(device));
  }
  t.workload.data = DataSource::resident(std::move(out));
  return t;
}

/// One Runner's runs of `lengths` steps, each continuing the last (set_first_step): their
/// losses end to end, the weights after the last, and each run's setup.
struct Continued {
  Trained trained;
  std::vector<RunSetup> setups;
};
Continued train_in_runs(Toy toy, Mode mode, const std::vector<int64_t>& lengths) {
  RunOptions o;
  o.mode = mode;
  o.batch_size = 4;
  o.workers = 2;
  Runner runner(toy.workload, o);
  Continued c;
  int64_t done = 0;
  for (const int64_t n : lengths) {
    runner.set_first_step(done);
    const std::vector<float> losses = runner.train(n);
    c.trained.losses.insert(c.trained.losses.end(), losses.begin(), losses.end());
    c.setups.push_back(runner.setup());
    done += n;
  }
  for (const auto& p : toy.head->parameters()) c.trained.weights.push_back(p.detach().cpu());
  c.trained.notes = runner.notes();
  return c;
}

// A Runner run again continues where its last run ended (set_first_step): three runs of one
// Runner train as one run of their steps, on resident batches and on a shuffled dataset.
TEST(RunnerTest, ARunnerRunAgainContinuesItsLastRun) {
  testing::use_deterministic_algorithms();
  auto on_dataset = [] {
    Toy t = make_toy(kCpu);
    t.workload.data = DataSource::from_dataset(std::make_shared<ToyDataset>(10), true, true);
    return t;
  };
  for (const Mode mode : workload_modes()) {
    const Trained whole = train(make_resident_toy(kCpu), mode, 9, 5);
    expect_same(whole, train_in_runs(make_resident_toy(kCpu), mode, {4, 2, 3}).trained,
                std::string("resident, ") + to_string(mode));
    expect_same(train(on_dataset(), mode, 9), train_in_runs(on_dataset(), mode, {4, 2, 3}).trained,
                std::string("dataset, ") + to_string(mode));
  }
  // Data made for each run starts at step 0 only.
  RunOptions o;
  Runner runner(make_toy(kCpu).workload, o);
  try {
    runner.set_first_step(3);
    FAIL() << "a first step was taken for data made per run";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "first step 3 is not valid for workload toy")) << e.what();
  }
}

TEST(RunnerTest, ResidentBatchesNeedNoLoader) {
  testing::use_deterministic_algorithms();
  auto make = [] {
    Toy t = make_toy(kCpu);
    std::vector<Batch> batches(3);
    for (int i = 0; i < 3; ++i) {
      std::vector<at::Tensor> fields{at::empty({5, kIn}), at::empty({5}, at::kLong)};
      ToyDataset d(15);
      for (int64_t s = 0; s < 5; ++s) d.get(i * 5 + s, {fields[0][s], fields[1][s]});
      batches[i].set("x", fields[0]);
      batches[i].set("label", fields[1]);
    }
    t.workload.data = DataSource::resident(std::move(batches));
    return t;
  };
  const Trained serial = train(make(), Mode::kSerial, 7);
  for (const Mode mode : workload_modes())
    expect_same(serial, train(make(), mode, 7), to_string(mode));
}

TEST(RunnerTest, WorkloadParamsAreCheckedByName) {
  const std::vector<WorkloadParam> known{{"augment", "where", {"gpu", "cpu"}}, {"free", "any", {}}};
  EXPECT_NO_THROW(check_params("w", {{"augment", "cpu"}, {"free", "7"}}, known));
  EXPECT_EQ(param_or_default({}, known, "augment"), "gpu");
  try {
    check_params("w", {{"augmnet", "cpu"}}, known);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "parameter 'augmnet' is not known to workload w: expected augment or free");
  }
  try {
    check_params("w", {{"augment", "tpu"}}, known);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "parameter augment='tpu' is not valid for workload w: expected gpu or cpu");
  }
}

// ---- GPU: the same workload, bitwise, with graphs really captured ----

TEST(RunnerGpuTest, EveryModeTrainsExactlyLikeSerial) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);  // deterministic cuBLAS (before first use)
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_toy(kCuda), Mode::kSerial, 24, 8, /*last=*/5);
  for (const Mode mode : workload_modes()) {
    const Trained got = train(make_toy(kCuda), mode, 24, 8, 5);
    expect_same(serial, got, to_string(mode));
    const std::string notes = joined(got.notes);
    if (mode == Mode::kGraphed) {
      EXPECT_TRUE(has(notes,
                      "captured: step (backbone: frozen linear; train: forward, loss, "
                      "backward, tandem::optim::Sgd step) as one graph after 3 eager "
                      "warm-up steps on a side lane; 20 replays"))
          << notes;
      EXPECT_TRUE(has(notes, "step 23 ran eagerly")) << notes;  // the short last batch
    }
    if (mode == Mode::kPipelinedGraphed) {
      EXPECT_TRUE(has(notes,
                      "captured: backbone (backbone: frozen linear) as one graph on lane "
                      "backbone after 3 eager warm-up steps on a side lane; 20 replays"))
          << notes;
      EXPECT_TRUE(has(notes, "captured: train (")) << notes;
    }
    if (mode == Mode::kGraphedK) {  // 3 warm-up, 5 replays of 4, then 1 staged + the short one
      EXPECT_TRUE(has(notes, "captured: 4 steps (") && has(notes, "; 5 replays")) << notes;
    }
    // The setup counts each graph the notes name, and its capture's seconds.
    const int graphs = mode == Mode::kPipelinedGraphed ? 2 : captures_graphs(mode) ? 1 : 0;
    EXPECT_EQ(got.setup.graphs, graphs) << to_string(mode);
    EXPECT_EQ(got.setup.capture_seconds > 0, graphs > 0) << to_string(mode);
    EXPECT_GT(got.setup.prepare_seconds, 0) << to_string(mode);
  }
}

// A later run of a Runner replays the graphs its first run captured, from its first step: no
// warm-up, no capture, and the losses of one run of all the steps (the serial loop's).
TEST(RunnerGpuTest, ALaterRunReplaysTheGraphsTheFirstCaptured) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_resident_toy(kCuda), Mode::kSerial, 16, 5);
  for (const Mode mode : {Mode::kGraphed, Mode::kPipelinedGraphed}) {
    const Continued c = train_in_runs(make_resident_toy(kCuda), mode, {6, 5, 5});
    expect_same(serial, c.trained, to_string(mode));
    const int graphs = mode == Mode::kPipelinedGraphed ? 2 : 1;
    EXPECT_EQ(c.setups[0].graphs, graphs) << to_string(mode);
    EXPECT_EQ(c.setups[0].graphs_kept, 0) << to_string(mode);
    for (size_t run = 1; run < c.setups.size(); ++run) {
      EXPECT_EQ(c.setups[run].graphs, 0) << to_string(mode) << " run " << run;
      EXPECT_EQ(c.setups[run].graphs_kept, graphs) << to_string(mode) << " run " << run;
      EXPECT_EQ(c.setups[run].capture_seconds, 0) << to_string(mode) << " run " << run;
    }
    const std::string notes = joined(c.trained.notes);
    EXPECT_TRUE(has(notes, "an earlier run of this runner captured")) << notes;
    EXPECT_TRUE(has(notes, "; 5 replays")) << notes;  // the last run's, every step of it
  }
}

TEST(RunnerGpuTest, AdamWUnderReplayMatchesEagerSteps) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_toy(kCuda, Opt::kAdamW), Mode::kSerial, 20, 8);
  for (const Mode mode : workload_modes())
    expect_same(serial, train(make_toy(kCuda, Opt::kAdamW), mode, 20, 8), to_string(mode));
}

TEST(RunnerGpuTest, AnEagerOnlyFeedSplitsTheGraphAndTrainsAlike) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const Trained serial = train(make_toy(kCuda), Mode::kSerial, 12, 8);
  Toy toy = make_toy(kCuda);
  toy.workload.feeds[0].capture = Capture::kNever;
  const Trained got = train(toy, Mode::kGraphed, 12, 8);
  expect_same(serial, got, "graphed");
  const std::string notes = joined(got.notes);
  // The note names the stage's units: "backbone ran eagerly (backbone: frozen linear): ...".
  EXPECT_TRUE(has(notes,
                  "backbone ran eagerly (backbone: frozen linear): its stage is "
                  "Capture::kNever"))
      << notes;
  EXPECT_TRUE(has(notes, "captured: train (")) << notes;
}

// A failure inside a graphed stage's warm-up, while the other graphed stage waits for it at the
// warm-up barrier, and a real out-of-memory error: both end the run with one line, never a hang.
TEST(RunnerGpuTest, AFailureOrOutOfMemoryInAGraphedPipelineEndsTheRun) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const bool oom : {false, true}) {
    SCOPED_TRACE(oom ? "out of memory" : "exception in warm-up");
    Toy toy = make_toy(kCuda);
    const auto loss = toy.workload.train.loss;
    auto calls = std::make_shared<std::atomic<int>>(0);
    toy.workload.train.loss = [loss, oom, calls](const Tensors& in) {
      if (++*calls == 2) {
        if (oom)
          at::empty({int64_t{1} << 44}, in[0].options());  // 64 TiB of floats
        else
          throw std::runtime_error("train broke");
      }
      return loss(in);
    };
    RunOptions o;
    o.mode = Mode::kPipelinedGraphed;
    o.batch_size = 8;
    auto done = std::async(std::launch::async, [&] {
      Runner runner(toy.workload, o);
      try {
        runner.train(30);
      } catch (const RunError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(120)), std::future_status::ready) << "hung";
    const std::string what = done.get();
    EXPECT_TRUE(has(what,
                    "stage 'train' (lane train) failed at step 1 in mode "
                    "pipelined+graphed at batch size 8: "))
        << what;
    EXPECT_TRUE(has(what, oom ? "out of memory" : "train broke")) << what;
  }
}

}  // namespace
}  // namespace tandem
