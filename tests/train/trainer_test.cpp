// The train layer on the CPU: checkpoints (atomic, kept), optimizer state, the Trainer's
// metrics, bf16, a non-finite loss, and the classifier and segmenter jobs (resume_test.cpp: the
// exact resume, its records and its checks).
#include "tandem/train/trainer.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "tandem/data/nvjpeg_decoder.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/error.h"
#include "tandem/models/safetensors.h"
#include "tandem/optim.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/classifier.h"
#include "tandem/train/report.h"
#include "train_fixtures.h"

namespace tandem::train {
namespace {

using data::testing::TempDir;
using fixtures::Fixture;
using fixtures::options;
using fixtures::small_job;
using fixtures::write_idx;

TEST(TrainerTest, WritesMetricsAndLearns) {
  Fixture f;
  TrainOptions o = options(f.tmp.path() + "/run", Mode::kSerial, 3);
  o.schedule = optim::constant_lr(3e-3);
  const TrainResult r = Trainer(make_classifier(small_job(f.data)), o).run();
  ASSERT_EQ(r.epochs.size(), 3u);
  EXPECT_GT(r.epochs.back().metrics.at("accuracy"), 0.6);  // 4 classes: chance is 0.25
  std::ifstream jsonl(f.tmp.path() + "/run/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("epoch").get<int64_t>(), ++lines);
    EXPECT_TRUE(j.contains("accuracy") && j.contains("train_loss"));
    EXPECT_FALSE(j.contains("resumed_at_step")) << line;  // marks only a resumed epoch
    // The evaluation said how many images it scored: its rate is that over its seconds.
    ASSERT_TRUE(j.contains("eval_images_per_s")) << line;
    EXPECT_NEAR(j.at("eval_images_per_s").get<double>() * j.at("eval_seconds").get<double>(),
                static_cast<double>(f.val_images), 1e-6 * static_cast<double>(f.val_images))
        << line;
  }
  EXPECT_EQ(lines, 3);
  std::ifstream csv(f.tmp.path() + "/run/metrics.csv");
  std::getline(csv, line);
  EXPECT_EQ(line,
            "epoch,step,train_loss,accuracy,val_loss,lr,images_per_s,epoch_images_per_s,"
            "train_seconds,eval_seconds,eval_images_per_s,resumed_at_step");
  std::getline(csv, line);
  EXPECT_EQ(line.back(), ',') << line;  // not resumed: the last column is empty
  // keep 3 checkpoints: one per epoch
  EXPECT_EQ(CheckpointStore(f.tmp.path() + "/run/checkpoints", 3).list().size(), 3u);
  EXPECT_NO_THROW(models::load_safetensors(r.weights));
}

// The names in folder `dir`, sorted ("." and ".." left out).
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Without a run folder the loop trains a count of steps, which may end inside an epoch, writes
// nothing, and continues an earlier run from its first step: two runs of 4 and 6 steps over one
// job compute one run's 10 losses, bitwise (serial, on the CPU).
TEST(TrainerTest, WithoutARunFolderStepsContinueAsOneRunAndNothingIsWritten) {
  Fixture f;
  auto steps_from = [&](TrainJob& job, int64_t first, int64_t steps) {
    TrainOptions o = options("", Mode::kSerial, 2);
    o.steps = steps;
    o.first_step = first;
    const TrainResult r = Trainer(job, o).run();
    EXPECT_EQ(r.steps, first + steps);
    EXPECT_TRUE(r.epochs.empty());  // no folder, no evaluation: no epochs ended
    EXPECT_TRUE(r.last_checkpoint.empty() && r.weights.empty());
    EXPECT_GT(r.seconds, 0);
    return r.losses;
  };
  TrainJob whole = make_classifier(small_job(f.data)), parts = make_classifier(small_job(f.data));
  whole.evaluate = parts.evaluate = nullptr;
  // The jobs draw from the default generator too: each run of 10 starts from the same state.
  at::manual_seed(11);
  const std::vector<float> one = steps_from(whole, 0, 10);
  at::manual_seed(11);
  std::vector<float> two = steps_from(parts, 0, 4);
  const std::vector<float> rest = steps_from(parts, 4, 6);
  two.insert(two.end(), rest.begin(), rest.end());
  ASSERT_EQ(one.size(), 10u);
  EXPECT_EQ(one, two);
  EXPECT_EQ(entries(f.tmp.path()), std::vector<std::string>{"idx"});
  EXPECT_NE(::access("/checkpoints", F_OK), 0);  // where a folder's store under "" would go

  // An evaluating job ends its epochs without a folder: their records, nothing written.
  TrainOptions o = options("", Mode::kSerial, 2);
  o.steps = 10;  // one whole epoch of 6 steps, then 4 of the next
  const TrainResult r = Trainer(make_classifier(small_job(f.data)), o).run();
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].step, 6);
  EXPECT_TRUE(r.epochs[0].metrics.count("accuracy"));
  EXPECT_EQ(entries(f.tmp.path()), std::vector<std::string>{"idx"});
}

// One Trainer's later runs (set_next_run) continue its last on the Runner it kept: runs of 4,
// 2 and 4 steps compute one run's 10 losses, bitwise, in an eager mode and a graphed one (on
// the CPU, eager); a next run the Runner was not built for is refused, naming what differs.
TEST(TrainerTest, ANextRunContinuesTheLastOnTheKeptRunner) {
  Fixture f;
  for (const Mode mode : {Mode::kPipelined, Mode::kPipelinedGraphed}) {
    auto plain = [&] {
      TrainJob job = make_classifier(small_job(f.data));
      job.evaluate = nullptr;
      return job;
    };
    auto with_steps = [&](int64_t first, int64_t steps) {
      TrainOptions o = options("", mode, 2);
      o.first_step = first;
      o.steps = steps;
      return o;
    };
    at::manual_seed(11);
    const std::vector<float> one = Trainer(plain(), with_steps(0, 10)).run().losses;
    at::manual_seed(11);
    Trainer trainer(plain(), with_steps(0, 4));
    std::vector<float> parts = trainer.run().losses;
    for (const auto& [first, steps] : {std::pair<int64_t, int64_t>{4, 2}, {6, 4}}) {
      trainer.set_next_run(with_steps(first, steps));
      const TrainResult r = trainer.run();
      EXPECT_EQ(r.steps, first + steps);
      parts.insert(parts.end(), r.losses.begin(), r.losses.end());
    }
    ASSERT_EQ(one.size(), 10u);
    EXPECT_EQ(one, parts) << to_string(mode);

    TrainOptions other = with_steps(10, 2);
    other.batch_size = 8;
    try {
      trainer.set_next_run(other);
      FAIL() << "a next run at another batch size was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("batch size 16, 2 workers, seed 3: expected the same"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(TrainerTest, WhatNeedsARunFolderIsRefusedWithoutOne) {
  Fixture f;
  auto refusal = [&](const std::string& out, const std::function<void(TrainOptions&)>& set) {
    TrainOptions o = options(out, Mode::kSerial, 2);
    set(o);
    try {
      Trainer(make_classifier(small_job(f.data)), o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(refusal("", [](TrainOptions& o) { o.resume = true; }).find("expected a run folder"),
            std::string::npos);
  EXPECT_NE(refusal("", [](TrainOptions& o) { o.checkpoint_every = 2; })
                .find("checkpoints every 2 steps go into a run folder"),
            std::string::npos);
  EXPECT_NE(refusal(f.tmp.path() + "/run", [](TrainOptions& o) { o.steps = 5; })
                .find("trains whole epochs"),
            std::string::npos);
  EXPECT_NE(refusal(f.tmp.path() + "/run", [](TrainOptions& o) { o.first_step = 3; })
                .find("starts where its checkpoint is"),
            std::string::npos);
}

// Every evaluation of a run runs on one thread, the last epoch's (after the pipeline's threads
// have ended) included: ATen keeps cuDNN's tuned convolution plans per thread, so an evaluation
// on a fresh thread would tune them again.
TEST(TrainerTest, EveryEvaluationRunsOnOneThread) {
  Fixture f;
  TrainJob job = make_classifier(small_job(f.data));
  auto threads = std::make_shared<std::vector<std::thread::id>>();
  const auto evaluate = job.evaluate;
  job.evaluate = [evaluate, threads](const Lane& lane) {
    threads->push_back(std::this_thread::get_id());
    return evaluate(lane);
  };
  const TrainResult r = Trainer(job, options(f.tmp.path() + "/run", Mode::kPipelined, 3)).run();
  ASSERT_EQ(r.epochs.size(), 3u);
  ASSERT_EQ(threads->size(), 3u);
  EXPECT_EQ((*threads)[1], (*threads)[0]);
  EXPECT_EQ((*threads)[2], (*threads)[0]);
  EXPECT_NE((*threads)[0], std::this_thread::get_id());
  EXPECT_TRUE(r.epochs.back().metrics.count("accuracy"));
}

// A job's evaluation is rehearsed once, during the first epoch of a Trainer's first run and
// before its first evaluation, on the thread that evaluates; its seconds are reported, and the
// run's losses do not change.
TEST(TrainerTest, TheEvaluationIsPreparedOnceDuringTheFirstEpochOnItsThread) {
  Fixture f;
  struct Seen {
    std::vector<std::thread::id> eval_threads;
    std::vector<size_t> evaluations_before_prepare;
    std::thread::id prepare_thread;
  };
  auto seen = std::make_shared<Seen>();
  TrainJob job = make_classifier(small_job(f.data));
  ASSERT_FALSE(job.prepare_evaluation);  // on the CPU there are no kernels to load
  const auto evaluate = job.evaluate;
  job.evaluate = [evaluate, seen](const Lane& lane) {
    seen->eval_threads.push_back(std::this_thread::get_id());
    return evaluate(lane);
  };
  job.prepare_evaluation = [seen](const Lane&) {
    seen->evaluations_before_prepare.push_back(seen->eval_threads.size());
    seen->prepare_thread = std::this_thread::get_id();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  Trainer trainer(job, options(f.tmp.path() + "/run", Mode::kPipelined, 3));
  const TrainResult r = trainer.run();
  ASSERT_EQ(seen->evaluations_before_prepare, std::vector<size_t>{0});
  ASSERT_EQ(seen->eval_threads.size(), 3u);
  EXPECT_EQ(seen->prepare_thread, seen->eval_threads[0]);
  EXPECT_GE(r.evaluation_prepare_seconds, 0.02);

  TrainJob plain = make_classifier(small_job(f.data));
  const TrainResult without =
      Trainer(plain, options(f.tmp.path() + "/plain", Mode::kPipelined, 3)).run();
  EXPECT_EQ(without.evaluation_prepare_seconds, 0);
  EXPECT_EQ(r.losses, without.losses);
}

// The report gives what a run paid apart from its steady rates: the seconds before its first
// step (and the evaluation's rehearsal), then its first epoch's wall-clock rate and its first
// evaluation's; a resumed run's first is its own first epoch, not the checkpoint's.
TEST(TrainerTest, TheReportGivesTheSetupAndTheFirstEpochApart) {
  TrainResult r;
  for (int i = 1; i <= 2; ++i) {
    EpochRecord e;
    e.epoch = i;
    e.step = 6 * i;
    e.images_per_s = i == 1 ? 100 : 110;
    e.epoch_images_per_s = i == 1 ? 50 : 105;
    e.eval_images_per_s = i == 1 ? 30 : 200;
    r.epochs.push_back(e);
  }
  r.setup.prepare_seconds = 1.5;
  r.setup.capture_seconds = 0.25;
  r.evaluation_prepare_seconds = 0.04;
  const EpochsReport report = describe_epochs(r, 6);
  EXPECT_EQ(report.first_epoch_images_per_s, 50);
  EXPECT_EQ(report.first_eval_images_per_s, 30);
  EXPECT_EQ(report.images_per_s.value, 110);  // the steady mean leaves the first out
  EXPECT_NE(report.text.find("setup      1.50 s before the first step, captures 0.25 s, the "
                             "evaluation's kernels 0.04 s\n"),
            std::string::npos)
      << report.text;
  EXPECT_NE(report.text.find("first      epoch 50 img/s from its first step, its evaluation 30 "
                             "img/s\n"),
            std::string::npos)
      << report.text;

  r.resumed_from = 6;  // the second epoch is this run's only one
  const EpochsReport resumed = describe_epochs(r, 6);
  EXPECT_EQ(resumed.first_epoch_images_per_s, 105);
  EXPECT_EQ(resumed.text.find("first      epoch"), std::string::npos) << resumed.text;
}

// bf16 autocast is entered inside each stage's function (autocast is thread-local), so it holds
// in the pipelined modes' stage threads too: the loss is computed in bf16 there (it differs from
// fp32's), stays finite, and the run learns; the weights stay fp32.
class Bf16Test : public ::testing::TestWithParam<Mode> {};

// small_job in fp32 and in `low` precision in `mode`: the low run's loss computed in it (not
// silently in fp32), close to fp32's, finite, learning; its weights fp32; a loss scale where
// the precision needs one.
void expect_trains_in(Precision low, Mode mode) {
  Fixture f;
  ClassifierOptions c = small_job(f.data);
  TrainOptions o = options(f.tmp.path() + "/fp32", mode, 2);
  o.schedule = optim::constant_lr(3e-3);
  const TrainResult fp32 = Trainer(make_classifier(c), o).run();
  c.precision = low;
  o.out_dir = f.tmp.path() + "/" + to_string(low);
  TrainJob job = make_classifier(c);
  EXPECT_EQ(job.workload.train.loss_scale != nullptr, needs_loss_scale(low));
  const TrainResult run = Trainer(std::move(job), o).run();
  ASSERT_EQ(run.losses.size(), fp32.losses.size());
  EXPECT_NE(run.losses[0], fp32.losses[0]);  // computed in low precision
  EXPECT_NEAR(run.losses[0], fp32.losses[0], 0.05);
  for (float l : run.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(run.epochs.back().train_loss, run.epochs.front().train_loss);
  for (const auto& [name, t] : models::load_safetensors(run.weights))
    if (t.is_floating_point()) {
      EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    }
}

TEST_P(Bf16Test, TrainsInEveryMode) { expect_trains_in(Precision::kBf16, GetParam()); }

// The same in fp16, with its loss scale.
TEST_P(Bf16Test, Fp16WithItsLossScaleTrainsInEveryMode) {
  expect_trains_in(Precision::kFp16, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Modes, Bf16Test,
                         ::testing::Values(Mode::kSerial, Mode::kPipelined, Mode::kGraphed,
                                           Mode::kPipelinedGraphed),
                         [](const auto& mode) {
                           std::string n = to_string(mode.param);
                           for (char& ch : n)
                             if (ch == '+') ch = '_';
                           return n;
                         });

// A job whose loss turns NaN at one step, to see the run stop there and keep what was good.
TrainJob nan_at(const std::string& data, int64_t bad_step) {
  TrainJob job = make_classifier(small_job(data));
  auto calls = std::make_shared<int64_t>(0);
  auto loss = job.workload.train.loss;
  job.workload.train.loss = [loss, calls, bad_step](const Tensors& in) {
    at::Tensor l = loss(in);
    return (*calls)++ == bad_step ? l * std::nanf("") : l;
  };
  return job;
}

TEST(TrainerTest, NonFiniteLossStopsNamingTheStepAndKeepsTheLastCheckpoint) {
  Fixture f;
  TrainOptions o = options(f.tmp.path() + "/run", Mode::kSerial);
  o.checkpoint_every = 2;
  o.progress_seconds = 0;
  o.on_progress = [](const TrainOptions::Progress&) {};
  try {
    Trainer(nan_at(f.data, 3), o).run();
    FAIL() << "expected NonFiniteLoss";
  } catch (const NonFiniteLoss& e) {
    EXPECT_NE(std::string(e.what()).find("step 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step-000000002"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("try a lower --lr"), std::string::npos) << e.what();
  }
  const auto kept = CheckpointStore(f.tmp.path() + "/run/checkpoints", 3).list();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_NE(kept[0].find("step-000000002"), std::string::npos);
  for (const auto& [name, t] : CheckpointStore::load(kept[0]).model)
    if (t.is_floating_point()) {
      EXPECT_TRUE(t.isfinite().all().item<bool>()) << name;
    }
}

// Weights that hold a NaN before the first step make the first loss NaN: the message names the
// weights file and the tensor, not the learning rate.
TEST(TrainerTest, NonFiniteStartingWeightsAreNamedNotTheLearningRate) {
  Fixture f;
  const std::string w = f.tmp.path() + "/nan.safetensors";
  {
    models::NamedTensors t = models::state_dict(*make_classifier(small_job(f.data)).model);
    for (auto& [name, v] : t) v = v.detach().clone();
    ASSERT_EQ(t[0].first, "conv1.weight");
    t[0].second.view({-1})[3] = std::nanf("");
    models::save_safetensors(w, t);
  }
  ClassifierOptions c = small_job(f.data);
  c.weights = w;
  try {
    Trainer(make_classifier(c), options(f.tmp.path() + "/run", Mode::kSerial)).run();
    FAIL() << "expected NonFiniteLoss";
  } catch (const NonFiniteLoss& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the loss of step 0"), std::string::npos) << m;
    EXPECT_NE(m.find("the starting weights (--weights "), std::string::npos) << m;
    EXPECT_NE(m.find("nan.safetensors) hold non-finite values (conv1.weight)"), std::string::npos)
        << m;
    EXPECT_EQ(m.find("--lr"), std::string::npos) << m;
  }
}

TEST(TrainerTest, UnwritableCheckpointStopsTheRunAndKeepsTheLastGood) {
  Fixture f;
  const std::string out = f.tmp.path() + "/run";
  TrainOptions o = options(out, Mode::kSerial);
  o.checkpoint_every = 2;
  Trainer trainer(make_classifier(small_job(f.data)), o);
  // A file where the step-4 checkpoint's temporary folder goes: its mkdir fails, as on a full or
  // read-only disk (root ignores permission bits, so a chmod would not do it in CI).
  data::testing::make_dirs(out + "/checkpoints");
  data::write_file(out + "/checkpoints/step-000000004.tmp", {'x'});
  try {
    trainer.run();
    FAIL() << "expected the run to stop";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint at step 4 not written"), std::string::npos)
        << e.what();
  }
  const auto kept = CheckpointStore(out + "/checkpoints", 3).list();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(CheckpointStore::load(kept[0]).step, 2);
}

TEST(CheckpointStoreTest, KeepsTheLastKAndIgnoresUnfinishedOnes) {
  TempDir tmp;
  CheckpointStore store(tmp.path() + "/ck", 2);
  for (int64_t s : {5, 10, 15}) {
    Checkpoint c;
    c.step = s;
    c.model = {{"w", at::full({2}, static_cast<float>(s))}};
    store.save(c);
  }
  data::testing::make_dirs(tmp.path() + "/ck/step-000000020.tmp");  // a save cut short
  const auto all = store.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(*store.latest(), tmp.path() + "/ck/step-000000015");
  const Checkpoint back = CheckpointStore::load(all[0]);
  EXPECT_EQ(back.step, 10);
  EXPECT_TRUE(at::equal(back.model[0].second, at::full({2}, 10.f)));
}

TEST(OptimizerStateTest, RoundTripsAndListsMismatches) {
  at::Tensor p = at::randn({3, 2}).requires_grad_(true);
  optim::Adam a({p}, optim::AdamOptions::adamw(1e-2));
  p.mutable_grad() = at::ones_like(p);
  a.step();
  at::Tensor q = p.detach().clone().requires_grad_(true);
  optim::Adam b({q}, optim::AdamOptions::adamw(1e-2));
  b.load_state(a.state());
  for (size_t i = 0; i < a.state().size(); ++i)
    EXPECT_TRUE(at::equal(a.state()[i].second, b.state()[i].second)) << a.state()[i].first;
  try {
    b.load_state({{"lr", at::zeros({})}, {"bogus", at::zeros({1})}});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unexpected 'bogus'"), std::string::npos) << m;
    EXPECT_NE(m.find("missing 'step'"), std::string::npos) << m;
  }

  optim::Sgd s({p}, optim::SgdOptions{0.1, 0.9});
  EXPECT_EQ(s.state().size(), 1u);  // no momentum buffer before the first step
  s.step();
  ASSERT_EQ(s.state().size(), 2u);
  optim::Sgd t({q}, optim::SgdOptions{0.1, 0.9});
  t.load_state(s.state());
  ASSERT_EQ(t.state().size(), 2u);
  EXPECT_TRUE(at::equal(t.state()[1].second, s.state()[1].second));
}

TEST(ClassifierTest, WeightsThatDoNotFitAreNamed) {
  Fixture f;
  const std::string w = f.tmp.path() + "/w.safetensors";
  models::save_safetensors(w, {{"conv1.weight", at::zeros({3, 3})}, {"extra", at::zeros({1})}});
  ClassifierOptions c = small_job(f.data);
  c.weights = w;
  try {
    make_classifier(c);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("do not fit"), std::string::npos) << m;
    EXPECT_NE(m.find("extra"), std::string::npos) << m;
    EXPECT_NE(m.find("conv1.weight"), std::string::npos) << m;
  }
}

TEST(ClassifierTest, BadOptionsAreNamed) {
  Fixture f;
  ClassifierOptions c = small_job(f.data);
  c.model = "resnet18";
  EXPECT_THROW(make_classifier(c), InvalidArgument);  // IDX is gray 28x28
  c = small_job(f.data + "/train-images-idx3-ubyte");
  EXPECT_THROW(make_classifier(c), InvalidArgument);  // a file, not a folder
  c = small_job(f.data);
  c.optimizer = "lbfgs";
  EXPECT_THROW(make_classifier(c), InvalidArgument);
  for (const int nice : {-1, 20}) {
    c = small_job(f.data);
    c.worker_nice = nice;
    try {
      make_classifier(c);
      ADD_FAILURE() << "worker nice " << nice << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("worker nice value " + std::to_string(nice) +
                                           " is not valid: expected 0 to 19"),
                std::string::npos)
          << e.what();
    }
  }
  c = small_job(f.data);
  c.worker_nice = 6;
  EXPECT_EQ(make_classifier(c).workload.data.worker_nice(), 6) << "the training's loader is told";
}

// An ImageFolder of n 40x48 PNGs in two classes (dark and bright).
std::string write_folder(const TempDir& tmp, int n) {
  for (int i = 0; i < n; ++i) {
    const int cls = i % 2;
    at::Tensor img = at::full({3, 40, 48}, cls ? 190 : 40, at::kByte);
    img.add_(at::arange(40 * 48, at::kInt).remainder(37).view({1, 40, 48}).to(at::kByte));
    data::testing::put(
        tmp, std::string("folder/") + (cls ? "bright/" : "dark/") + std::to_string(i) + ".png",
        data::encode_png(img));
  }
  return tmp.path() + "/folder";
}

// --freeze backbone: the backbone runs folded (batch norm in its convolutions) in training and
// in evaluation; it evaluates as the whole module does within float rounding, and training moves
// the head alone.
TEST(ClassifierTest, AFrozenBackboneEvaluatesAsTheModuleAndStaysFrozen) {
  TempDir tmp;
  ClassifierOptions c;
  c.data = write_folder(tmp, 24);
  c.model = "resnet18";
  c.image_size = 32;
  c.val_split = 0.5;
  c.batch_size = 4;
  c.workers = 2;
  c.seed = 5;
  c.channels_last = false;
  c.device = c10::Device(c10::kCPU);
  const Lane lane = Lane::create("eval", c.device);
  TrainJob module_job = make_classifier(c);  // the same seed: the same weights
  c.freeze_backbone = true;
  TrainJob frozen_job = make_classifier(c);
  const Metrics a = module_job.evaluate(lane).metrics, b = frozen_job.evaluate(lane).metrics;
  EXPECT_NEAR(b.at("val_loss"), a.at("val_loss"), 1e-4 * std::abs(a.at("val_loss")));
  EXPECT_EQ(b.at("accuracy"), a.at("accuracy"));

  std::map<std::string, at::Tensor> before;
  for (const auto& p : frozen_job.model->named_parameters()) before[p.key()] = p.value().clone();
  TrainOptions o = options(tmp.path() + "/run", Mode::kPipelined, 1);
  o.batch_size = 4;
  Trainer(std::move(frozen_job), o).run();
  const models::NamedTensors saved =
      models::load_safetensors(tmp.path() + "/run/model.safetensors");
  int changed = 0;
  for (const auto& [name, t] : saved) {
    if (!before.count(name)) continue;  // buffers
    const bool same = t.equal(before.at(name).to(t.dtype()));
    if (name.rfind("fc.", 0) == 0)
      changed += !same;
    else
      EXPECT_TRUE(same) << name << " changed in a frozen backbone";
  }
  EXPECT_EQ(changed, 2) << "fc.weight and fc.bias train";
}

// A segmentation folder of n 64x64 pairs: one half of each image dark (class 0), the other
// bright (class 1), the bright side alternating, with a few ignored (255) pixels on the border.
std::string write_pairs(const TempDir& tmp, int n) {
  for (int i = 0; i < n; ++i) {
    at::Tensor img = at::empty({3, 64, 64}, at::kByte), mask = at::empty({1, 64, 64}, at::kByte);
    uint8_t* p = img.data_ptr<uint8_t>();
    uint8_t* m = mask.data_ptr<uint8_t>();
    for (int y = 0; y < 64; ++y)
      for (int x = 0; x < 64; ++x) {
        const bool right = x >= 32;
        const int cls = (i % 2 == 0) == right ? 1 : 0;
        for (int c = 0; c < 3; ++c)
          p[(c * 64 + y) * 64 + x] =
              static_cast<uint8_t>((cls ? 170 : 30) + (x * 7 + y * 3 + c * 11 + i) % 50);
        m[y * 64 + x] = static_cast<uint8_t>(y == 0 ? 255 : cls);
      }
    const std::string stem = "s" + std::to_string(i);
    data::testing::put(tmp, "seg/images/" + stem + ".png", data::encode_png(img));
    data::testing::put(tmp, "seg/masks/" + stem + ".png", data::encode_png(mask));
  }
  return tmp.path() + "/seg";
}

// A segmentation job over `count` pairs write_pairs makes: 2 classes, 64 px, batch 8.
ClassifierOptions pairs_job(TempDir& tmp, int count) {
  ClassifierOptions c;
  c.data = write_pairs(tmp, count);
  c.classes = 2;
  c.image_size = 64;
  c.val_split = 0.25;
  c.batch_size = 8;
  c.workers = 2;  // as options()'s
  return c;
}

TEST(TrainerTest, RefusesAJobBuiltForAnotherBatchSizeOrWorkerCount) {
  Fixture f;
  ClassifierOptions c = small_job(f.data);  // batch size 16, 2 workers
  TrainOptions o = options("", Mode::kSerial, 1);
  o.batch_size = 32;
  try {
    Trainer(make_classifier(c), o);
    ADD_FAILURE() << "a job built for batch size 16 ran at 32";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("was built for batch size 16 and 2 loader workers "
                                         "(ClassifierOptions), the run asks 32 and 2 "
                                         "(TrainOptions): expected the same in both"),
              std::string::npos)
        << e.what();
  }
  o.batch_size = 16;
  o.workers = 3;
  EXPECT_THROW(Trainer(make_classifier(c), o), InvalidArgument);
  o.workers = 2;
  EXPECT_NO_THROW(Trainer(make_classifier(c), o));
  TrainJob by_hand = make_classifier(c);  // a job with no loaders of its own: no check
  by_hand.built_for_batch_size = 0;
  by_hand.built_for_workers = 0;
  o.batch_size = 32;
  EXPECT_NO_THROW(Trainer(std::move(by_hand), o));
}

TEST(TrainerTest, LoaderWorkersDefaultToEveryFrontEndsRule) {
  EXPECT_EQ(TrainOptions{}.workers, 0);  // 0: the rule, resolved for the job's device
  EXPECT_EQ(ClassifierOptions{}.workers, 0);
  Fixture f;
  ClassifierOptions c = small_job(f.data);
  c.workers = 0;
  const TrainJob job = make_classifier(c);
  EXPECT_EQ(job.built_for_workers, distributed::default_loader_workers(c.device));
  TrainOptions o = options("", Mode::kSerial, 1);
  o.workers = 0;
  EXPECT_NO_THROW(Trainer(job, o));  // the same rule on both sides: the job is the run's
  o.workers = -1;
  EXPECT_THROW(Trainer(job, o), InvalidArgument);
}

TEST(SegmenterTest, LearnsTheHalvesAndReportsMiou) {
  TempDir tmp;
  ClassifierOptions c = pairs_job(tmp, 48);
  c.seed = 1;
  TrainJob job = make_classifier(c);
  EXPECT_EQ(job.config.at("model"), "fcn_resnet18");
  TrainOptions o = options(tmp.path() + "/run", Mode::kSerial, 4);
  o.batch_size = 8;
  o.schedule = optim::constant_lr(1e-3);
  const TrainResult r = Trainer(job, o).run();
  ASSERT_EQ(r.epochs.size(), 4u);
  const Metrics& m = r.epochs.back().metrics;
  std::printf("segmentation, 4 CPU epochs: miou %.3f, pixel accuracy %.3f\n", m.at("miou"),
              m.at("pixel_accuracy"));
  EXPECT_GT(m.at("miou"), 0.6);  // predicting one class everywhere scores 0.25
  EXPECT_GT(m.at("pixel_accuracy"), 0.8);
  EXPECT_LT(r.epochs.back().train_loss, r.epochs.front().train_loss);
  // The weights are the whole FCN under torchvision's names.
  bool head = false, backbone = false;
  for (const auto& [name, t] : models::load_safetensors(r.weights)) {
    head = head || name == "classifier.4.weight";
    backbone = backbone || name == "backbone.layer4.1.bn2.running_var";
  }
  EXPECT_TRUE(head && backbone);
}

// On the GPU the normalize stage and the train step are captured (pipelined+graphed): nothing
// in them may copy from the host (the first version built its mean/std on the CPU each call and
// failed to capture on the H200).
TEST(SegmenterGpuTest, CapturesItsStagesAndTrains) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir tmp;
  ClassifierOptions c = pairs_job(tmp, 32);
  c.device = c10::Device(c10::kCUDA, 0);
  c.channels_last = true;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    c.precision = p;
    TrainOptions o = options(tmp.path() + "/run-" + to_string(p), Mode::kPipelinedGraphed, 3);
    o.batch_size = 8;
    o.schedule = optim::constant_lr(1e-3);
    const TrainResult r = Trainer(make_classifier(c), o).run();
    for (float l : r.losses) EXPECT_TRUE(std::isfinite(l)) << to_string(p);
    bool normalize = false, train = false;
    for (const auto& note : r.notes) {
      normalize = normalize || note.rfind("captured: normalize", 0) == 0;
      train = train || note.rfind("captured: train", 0) == 0;
    }
    EXPECT_TRUE(normalize && train) << to_string(p);
    EXPECT_GT(r.epochs.back().metrics.at("pixel_accuracy"), 0.8) << to_string(p);
  }
}

TEST(SegmenterTest, NeedsTheClassCount) {
  TempDir tmp;
  ClassifierOptions c;
  c.workers = 2;  // as options()'s: a Trainer refuses a job built for another
  c.data = write_pairs(tmp, 2);
  try {
    make_classifier(c);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--classes"), std::string::npos) << e.what();
  }
  c.classes = 2;
  c.model = "resnet18";
  EXPECT_THROW(make_classifier(c), InvalidArgument);
}

// CI's accuracy check: one CPU epoch of the small CNN on a Fashion-MNIST subset reaches
// 80% test accuracy. The bootstrap installs Debian's dataset-fashion-mnist.
TEST(FashionMnistTest, OneEpochOnASubsetReaches80Percent) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!is_idx_folder(dir)) GTEST_SKIP() << dir << " is absent (Debian dataset-fashion-mnist)";
  TempDir tmp;
  ClassifierOptions c;
  c.data = dir;
  c.subset = 12000;
  c.val_subset = 2000;
  c.batch_size = 64;
  c.workers = 2;  // as options()'s
  TrainOptions o = options(tmp.path() + "/run", Mode::kSerial, 1);
  o.batch_size = 64;
  o.schedule = optim::linear_warmup(20, optim::cosine(2e-3, 12000 / 64 - 20));
  const TrainResult r = Trainer(make_classifier(c), o).run();
  ASSERT_EQ(r.epochs.size(), 1u);
  std::printf("fashion-mnist, 1 epoch of 12000 on the CPU: accuracy %.4f\n",
              r.epochs[0].metrics.at("accuracy"));
  EXPECT_GE(r.epochs[0].metrics.at("accuracy"), 0.80);
}

}  // namespace
}  // namespace tandem::train

namespace tandem::train {
namespace {

using data::testing::TempDir;
using fixtures::options;
using fixtures::write_idx;

// `n` JPEGs in tmp/img, two classes (c1's images the negatives of c0's), of about h x w: a
// folder a ResNet tells apart in a few steps. Returns the folder.
std::string write_two_class_jpegs(const TempDir& tmp, int n, int64_t h, int64_t w) {
  for (int i = 0; i < n; ++i) {
    const int cls = i % 2;
    at::Tensor img = data::testing::smooth_image(3, h + (i % 5) * h / 10, w - (i % 3) * w / 12, i);
    if (cls) img = 255 - img;
    data::testing::put(tmp, "img/c" + std::to_string(cls) + "/" + std::to_string(i) + ".jpg",
                       data::encode_jpeg(img, 90));
  }
  return tmp.path() + "/img";
}

// Deterministic algorithms (warn-only: a few ops the jobs use have no deterministic kernel) and
// no cuDNN autotuning, for the GPU runs that compare losses to the bit.
void use_deterministic_gpu_algorithms() {
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

// A small ResNet-18 job over a folder of JPEGs: 32 px crops, SGD, channels-last.
void use_small_resnet(ClassifierOptions& c) {
  c.model = "resnet18";
  c.image_size = 32;
  c.optimizer = "sgd";
  c.lr = 0.05;
  c.channels_last = true;
}

// A small ResNet-18 job over `n` generated photos of about h x w, `val_split` of them held out,
// two loader workers, seed 5.
ClassifierOptions small_photo_job(const TempDir& tmp, int n, int64_t h, int64_t w, double val_split,
                                  int64_t batch_size, c10::Device device) {
  ClassifierOptions c;
  c.data = write_two_class_jpegs(tmp, n, h, w);
  use_small_resnet(c);
  c.val_split = val_split;
  c.batch_size = batch_size;
  c.workers = 2;
  c.seed = 5;
  c.device = device;
  return c;
}

// The evaluation decodes only each photo's center crop (with --crop region, the default) and
// scores as it does from whole images at Resize's scale: the same weights, the same photos, the
// same labels, within the two decodes' rounding.
TEST(ClassifierTest, CenterCropRegionsEvaluateAsWholeImages) {
  TempDir tmp;
  ClassifierOptions c = small_photo_job(tmp, 24, 300, 400, 0.5, 4, c10::Device(c10::kCPU));
  const Lane lane = Lane::create("eval", c.device);
  TrainJob job = make_classifier(c);
  ASSERT_TRUE(job.report);  // (the workers keep samples from the job's start: decoded ahead)
  const Evaluation regions = job.evaluate(lane);  // the same seed: the same weights
  // The run's note says what the evaluation kept (by default all: a few kB here).
  const std::string kept = job.report();
  EXPECT_NE(kept.find("12 of 12 held-out samples kept in host memory"), std::string::npos) << kept;
  EXPECT_EQ(kept.find("decode the rest"), std::string::npos) << kept;
  c.eval_cache_bytes = 0;  // nothing kept: no note
  EXPECT_FALSE(make_classifier(c).report);
  c.eval_cache_bytes = -1;
  c.crop_regions = false;
  c.worker_nice = 3;  // the loaders' workers below the evaluation's thread: the same scores
  TrainJob whole_job = make_classifier(c);
  EXPECT_EQ(whole_job.workload.data.worker_nice(), 3) << "the training's loader is told";
  const Evaluation whole = whole_job.evaluate(lane);
  EXPECT_EQ(regions.samples, 12);
  EXPECT_EQ(whole.samples, 12);
  EXPECT_NEAR(regions.metrics.at("accuracy"), whole.metrics.at("accuracy"), 1.0 / 12 + 1e-9);
  EXPECT_NEAR(regions.metrics.at("val_loss"), whole.metrics.at("val_loss"),
              0.002 * whole.metrics.at("val_loss"));
}

// A held-out set larger than the evaluation's ring (512 samples decoded ahead): the samples past
// it are read into the kept samples while the run trains (the note says how many), and the
// evaluation scores as one that keeps nothing and decodes every photo itself.
TEST(ClassifierTest, HeldOutSamplesPastTheRingAreReadWhileTheRunTrains) {
  TempDir tmp;
  ClassifierOptions c = small_photo_job(tmp, 1080, 40, 48, 0.5, 4, c10::Device(c10::kCPU));
  const Lane lane = Lane::create("eval", c.device);
  TrainJob job = make_classifier(c);
  ASSERT_TRUE(job.report);
  // Bounded wait for the evaluation's workers and the warmer (an allowance, not a measure).
  std::string note;
  for (int i = 0; i < 1000; ++i) {
    note = job.report();
    if (note.find("540 of 540") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(note.find("540 of 540 held-out samples kept"), std::string::npos) << note;
  EXPECT_NE(note.find("28 of them read while the training ran"), std::string::npos) << note;
  const Evaluation kept = job.evaluate(lane);
  c.eval_cache_bytes = 0;  // nothing kept or read ahead: every photo decoded by the evaluation
  const Evaluation decoded = make_classifier(c).evaluate(lane);
  EXPECT_EQ(kept.samples, 540);
  EXPECT_EQ(kept.metrics.at("accuracy"), decoded.metrics.at("accuracy"));
  EXPECT_EQ(kept.metrics.at("val_loss"), decoded.metrics.at("val_loss"));
}

// Job `c` in pipelined+graphed, 8 steps uninterrupted (in dir/a, into *a), then stopped after
// step 5 and resumed (dir/b, the resumed part into *resumed): the resumed steps' losses are the
// uninterrupted run's within 1e-6.
void run_and_resume(const ClassifierOptions& c, const std::string& dir, TrainResult* a,
                    TrainResult* resumed) {
  auto opts = [&](const std::string& out) {
    TrainOptions o = options(out, Mode::kPipelinedGraphed);
    o.schedule = optim::cosine(c.optimizer == "sgd" ? 0.05 : 1e-3, 8);
    return o;
  };
  *a = Trainer(make_classifier(c), opts(dir + "/a")).run();
  ASSERT_EQ(a->losses.size(), 8u);  // 64 / 16 = 4 steps an epoch, 2 epochs

  std::atomic<int> stop{0};
  TrainOptions first = opts(dir + "/b");
  first.stop = &stop;
  first.checkpoint_every = 1;
  first.progress_seconds = 0;
  first.on_progress = [&](const TrainOptions::Progress& p) {
    if (p.step >= 5) stop = SIGTERM;
  };
  const TrainResult b1 = Trainer(make_classifier(c), first).run();
  ASSERT_EQ(b1.stopped_by_signal, SIGTERM);
  const int64_t stopped_at = b1.steps;
  ASSERT_GT(stopped_at, 4);
  ASSERT_LT(stopped_at, 8);
  TrainOptions again = opts(dir + "/b");
  again.resume = true;
  *resumed = Trainer(make_classifier(c), again).run();
  ASSERT_EQ(static_cast<int64_t>(resumed->losses.size()), 8 - stopped_at);
  for (size_t i = 0; i < resumed->losses.size(); ++i)
    EXPECT_NEAR(resumed->losses[i], a->losses[static_cast<size_t>(stopped_at) + i], 1e-6)
        << "step " << stopped_at + static_cast<int64_t>(i);
}

// The resume tests' job on `device`: 16 a batch, seed 5, two workers (as options()'s: a Trainer
// refuses a job built for another).
ClassifierOptions resumable_job(c10::Device device) {
  ClassifierOptions c;
  c.workers = 2;
  c.device = device;
  c.batch_size = 16;
  c.seed = 5;
  return c;
}

// 64 training and 32 test IDX images of 4 classes in tmp/idx, for job `c`.
void use_small_idx(const TempDir& tmp, ClassifierOptions& c) {
  c.data = tmp.path() + "/idx";
  write_idx(c.data, "train", 64, 4, 1);
  write_idx(c.data, "t10k", 32, 4, 2);
}

// fp16: the checkpoint keeps the loss scale beside the optimizer's state, and a run stopped
// mid-epoch and resumed gives the uninterrupted run's losses.
TEST(TrainerTest, AnFp16RunResumesWithItsLossScale) {
  TempDir tmp;
  ClassifierOptions c = resumable_job(c10::Device(c10::kCPU));
  c.precision = Precision::kFp16;
  use_small_idx(tmp, c);
  TrainResult a, resumed;
  run_and_resume(c, tmp.path(), &a, &resumed);
  if (HasFatalFailure()) return;
  const std::optional<std::string> latest =
      CheckpointStore(tmp.path() + "/b/checkpoints", 3).latest();
  ASSERT_TRUE(latest.has_value());
  std::vector<std::string> names;
  for (const auto& [name, t] : CheckpointStore::load(*latest).optimizer) names.push_back(name);
  EXPECT_NE(std::find(names.begin(), names.end(), "loss_scale.scale"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "loss_scale.growth_tracker"), names.end());
}

// On the GPU, in pipelined+graphed mode with deterministic algorithms: stopping mid-epoch and
// resuming gives the uninterrupted run's losses within 1e-6. The IDX job draws only
// dropout (the device's default generator, inside the captured train step); the ImageFolder job
// draws its crops from the augment stage's own generator on another lane, which runs ahead of
// the train stage — the Runner's per-item generator snapshots are what make it resume exactly.
class TrainerGpuTest : public ::testing::TestWithParam<bool> {};

TEST_P(TrainerGpuTest, ResumeInPipelinedGraphedRepeatsTheLosses) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const bool folder = GetParam();
  use_deterministic_gpu_algorithms();
  TempDir tmp;
  ClassifierOptions c = resumable_job(c10::Device(c10::kCUDA, 0));
  if (folder) {
    c.data = write_two_class_jpegs(tmp, 64, 40, 48);
    use_small_resnet(c);
  } else {
    use_small_idx(tmp, c);
  }
  TrainResult a, b2;
  run_and_resume(c, tmp.path(), &a, &b2);
  if (HasFatalFailure()) return;
  const auto wa = models::load_safetensors(a.weights), wb = models::load_safetensors(b2.weights);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    if (wa[i].second.is_floating_point()) {
      EXPECT_TRUE(at::allclose(wa[i].second, wb[i].second, 1e-5, 1e-6)) << wa[i].first;
    }
  at::globalContext().setDeterministicAlgorithms(false, false);
}

INSTANTIATE_TEST_SUITE_P(Jobs, TrainerGpuTest, ::testing::Values(false, true),
                         [](const auto& job) { return job.param ? "ImageFolder" : "Idx"; });

// On CUDA a pass's last batch, shorter than the batch size, is padded to it for the forward (so
// cuDNN tunes no new shapes on a first evaluation) and its padding's logits dropped: the
// evaluation scores as on the CPU, which forwards the short batch as it is. 12 held-out photos
// in batches of 8: 8 + 4.
TEST(ClassifierGpuTest, AShortLastBatchEvaluatesAsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  use_deterministic_gpu_algorithms();
  TempDir tmp;
  ClassifierOptions c = small_photo_job(tmp, 24, 120, 160, 0.5, 8, c10::Device(c10::kCPU));
  c.channels_last = false;
  const TrainJob cpu_job = make_classifier(c);
  c.weights = tmp.path() + "/weights.safetensors";  // the CPU job's weights, for both
  models::save_safetensors(c.weights, models::state_dict(*cpu_job.model));
  const Evaluation cpu = make_classifier(c).evaluate(Lane::create("eval", c.device));
  c.device = c10::Device(c10::kCUDA, 0);
  const Evaluation gpu = make_classifier(c).evaluate(Lane::create("eval", c.device));
  c.channels_last = true;  // the padding keeps the layout
  const Evaluation gpu_nhwc = make_classifier(c).evaluate(Lane::create("eval", c.device));
  for (const Evaluation* e : {&cpu, &gpu, &gpu_nhwc}) EXPECT_EQ(e->samples, 12);
  for (const Evaluation* e : {&gpu, &gpu_nhwc}) {
    EXPECT_NEAR(e->metrics.at("accuracy"), cpu.metrics.at("accuracy"), 1e-9);
    EXPECT_NEAR(e->metrics.at("val_loss"), cpu.metrics.at("val_loss"),
                1e-3 * cpu.metrics.at("val_loss"));
  }
}

// On CUDA the folder classifier rehearses its evaluation during the first epoch (its kernels
// load while the first steps run): in pipelined+graphed mode, with and without the rehearsal,
// the run's losses and every evaluation's metrics are the same to the bit.
TEST(ClassifierGpuTest, ThePreparedEvaluationLeavesTheRunAsItWas) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  use_deterministic_gpu_algorithms();
  TempDir tmp;
  const ClassifierOptions c = small_photo_job(tmp, 64, 40, 48, 0.25, 8, c10::Device(c10::kCUDA, 0));
  auto opts = [&](const std::string& dir) {
    TrainOptions o = options(dir, Mode::kPipelinedGraphed, 2);
    o.batch_size = c.batch_size;
    return o;
  };
  TrainJob job = make_classifier(c);
  ASSERT_TRUE(job.prepare_evaluation);
  const TrainResult with = Trainer(job, opts(tmp.path() + "/with")).run();
  TrainJob plain = make_classifier(c);
  plain.prepare_evaluation = nullptr;
  const TrainResult without = Trainer(plain, opts(tmp.path() + "/without")).run();
  EXPECT_GT(with.evaluation_prepare_seconds, 0);
  EXPECT_EQ(without.evaluation_prepare_seconds, 0);
  EXPECT_EQ(with.losses, without.losses);
  ASSERT_EQ(with.epochs.size(), without.epochs.size());
  for (size_t e = 0; e < with.epochs.size(); ++e)
    EXPECT_EQ(with.epochs[e].metrics, without.epochs[e].metrics) << "epoch " << e;
  at::globalContext().setDeterministicAlgorithms(false, false);
}

// decode auto with a given share on a GPU with JPEG engines: half of each batch decoded by the
// engines, in training and in the evaluation. A run stopped mid-epoch resumes with the
// uninterrupted run's losses (the split's shares come back from the checkpoint), and the trained
// model evaluates as on the CPU's decodes (the same photos, decoded by other code).
TEST(TrainerSplitGpuTest, ASplitDecodeResumesExactlyAndEvaluatesAsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::string why_not;
  if (!data::NvjpegDecoder::open(0, &why_not, data::NvjpegBackend::kHardware))
    GTEST_SKIP() << why_not;
  use_deterministic_gpu_algorithms();
  TempDir tmp;
  ClassifierOptions c;
  c.workers = 2;  // as options()'s: a Trainer refuses a job built for another
  c.device = c10::Device(c10::kCUDA, 0);
  c.data = write_two_class_jpegs(tmp, 80, 120, 160);
  use_small_resnet(c);
  c.batch_size = 16;
  c.val_split = 0.2;
  c.seed = 5;
  c.decode = "auto";
  c.engine_share = 0.5;
  c.eval_cache_bytes = 0;  // kept samples would leave the evaluation to the workers alone
  TrainResult a, resumed;
  run_and_resume(c, tmp.path(), &a, &resumed);
  if (HasFatalFailure()) return;
  ASSERT_FALSE(a.epochs.empty());
  EXPECT_GT(a.epochs.back().eval_images_per_s, 0);
  bool said = false;
  for (const auto& note : a.notes)
    said = said || note.find("JPEG engines decode") != std::string::npos;
  EXPECT_TRUE(said) << "the run's notes say the split";

  // The trained weights, evaluated with the split and on the CPU's decodes alone.
  c.weights = a.weights;
  const Lane lane = Lane::create("eval", c.device);
  const Evaluation split = make_classifier(c).evaluate(lane);
  c.decode = "cpu";
  const Evaluation cpu = make_classifier(c).evaluate(lane);
  EXPECT_EQ(split.samples, 16);
  EXPECT_EQ(cpu.samples, 16);
  // Each row's label with its own image: a misplaced row would cost half the accuracy; the
  // decodes' own differences (full resolution against DCT-scaled) may move one borderline image.
  EXPECT_NEAR(split.metrics.at("accuracy"), cpu.metrics.at("accuracy"), 1.0 / 16 + 1e-9);
  EXPECT_NEAR(split.metrics.at("val_loss"), cpu.metrics.at("val_loss"),
              0.1 * cpu.metrics.at("val_loss") + 0.02);

  // In batches of 4 the engines decode one batch's rows while the next batch's parts load:
  // the same photos on the same sides, so the same scores (rows paired with their labels
  // across batches), up to the batch size's own convolution algorithms.
  c.decode = "auto";
  c.batch_size = 4;
  const Evaluation ahead = make_classifier(c).evaluate(lane);
  EXPECT_EQ(ahead.samples, 16);
  EXPECT_DOUBLE_EQ(ahead.metrics.at("accuracy"), split.metrics.at("accuracy"));
  EXPECT_NEAR(ahead.metrics.at("val_loss"), split.metrics.at("val_loss"),
              1e-3 * split.metrics.at("val_loss") + 1e-4);
  at::globalContext().setDeterministicAlgorithms(false, false);
}

}  // namespace
}  // namespace tandem::train
