// tuned_conv2d: off its cuDNN path it is LibTorch's convolution; on a GPU its values and
// gradients are LibTorch's in half and bfloat16, channels-last and not, with bias, stride and
// dilation, under autocast too; a shape is timed once for every thread of the process; kept
// plans come back from a file without timing, a runtime-compiled one without compiling, a job's
// built ahead on threads; under capture an unseen shape runs untimed; a ResNet's evaluation
// runs on the plans its training timed; a plans file that cannot be trusted is ignored with a
// note naming it.
#include "tandem/models/tuned_conv.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernel_warmup.h"
#include "resnet_step.h"
#include "tandem/error.h"
#include "tandem/models/conv_with_stats.h"
#include "test_util.h"

namespace tandem::models {
namespace tuned_conv_test {

using test_steps::max_relative;

std::string temporary_path(const char* name) {
  return "/tmp/tandem-tuned-conv-" + std::to_string(::getpid()) + "-" + name;
}

// cuDNN's benchmark mode, on which the tuned path depends (off by default in C++), for a test.
struct BenchmarkModeOn {
  const bool was = at::globalContext().benchmarkCuDNN();
  BenchmarkModeOn() { at::globalContext().setBenchmarkCuDNN(true); }
  ~BenchmarkModeOn() { at::globalContext().setBenchmarkCuDNN(was); }
};

struct Shape {
  int64_t n, c, k, size, kernel, stride, padding, dilation;
  bool bias;
  int64_t groups = 1;
};
// A ResNet's kinds of convolution, small: the stem's 7x7, a 1x1, a 3x3, a strided 3x3, a
// strided 1x1 with a bias, a dilated 3x3; and a MobileNet's and a ResNeXt's: a depthwise 3x3, a
// strided depthwise 5x5 with a bias, a 3x3 of 4 groups.
const Shape kShapes[] = {
    {4, 3, 16, 32, 7, 2, 3, 1, false},      {4, 32, 64, 14, 1, 1, 0, 1, false},
    {4, 32, 32, 14, 3, 1, 1, 1, false},     {4, 32, 32, 14, 3, 2, 1, 1, false},
    {4, 64, 32, 14, 1, 2, 0, 1, true},      {4, 16, 16, 14, 3, 1, 2, 2, false},
    {4, 32, 32, 14, 3, 1, 1, 1, false, 32}, {4, 64, 64, 14, 5, 2, 2, 1, true, 64},
    {4, 32, 64, 14, 3, 1, 1, 1, false, 4}};

struct Result {
  at::Tensor y, dx, dw, db;
};

Result run(bool tuned, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
           const Shape& s, const at::Tensor& dy) {
  const at::Tensor x = x0.detach().clone().requires_grad_(),
                   w = w0.detach().clone().requires_grad_();
  const at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_() : at::Tensor();
  const std::vector<int64_t> st{s.stride, s.stride}, pad{s.padding, s.padding},
      dil{s.dilation, s.dilation};
  const at::Tensor y = tuned ? tuned_conv2d(x, w, b, st, pad, dil, s.groups)
                             : at::conv2d(x, w, b, st, pad, dil, s.groups);
  y.backward(dy.defined() ? dy : torch::ones_like(y));
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : at::Tensor()};
}

// A shape's input and weight (scaled as a trained one's) on the GPU in `type` and `layout`,
// drawn in that order from the CPU's generator.
struct Operands {
  at::Tensor x, w;
};
Operands operands(const Shape& s, at::ScalarType type,
                  at::MemoryFormat layout = at::MemoryFormat::ChannelsLast) {
  const c10::Device cuda(c10::kCUDA, 0);
  at::Tensor x = torch::randn({s.n, s.c, s.size, s.size}).to(cuda, type).contiguous(layout);
  at::Tensor w = (torch::randn({s.k, s.c / s.groups, s.kernel, s.kernel}) * 0.1)
                     .to(cuda, type)
                     .contiguous(layout);
  return {x, w};
}

TEST(TunedConvTest, OnTheCpuItIsLibTorchsConvolution) {
  torch::manual_seed(1);
  const Shape s{2, 4, 6, 9, 3, 2, 1, 2, true};
  const at::Tensor x = torch::randn({2, 4, 9, 9}), w = torch::randn({6, 4, 3, 3}),
                   b = torch::randn({6});
  const Result got = run(true, x, w, b, s, {}), want = run(false, x, w, b, s, {});
  EXPECT_TRUE(at::equal(got.y, want.y));
  EXPECT_TRUE(at::allclose(got.dx, want.dx));
  EXPECT_TRUE(at::allclose(got.dw, want.dw));
  EXPECT_TRUE(at::allclose(got.db, want.db));
  // Groups as LibTorch's, and channels that do not match as LibTorch refuses them.
  const at::Tensor wg = torch::randn({6, 2, 3, 3});
  EXPECT_TRUE(at::equal(tuned_conv2d(x, wg, {}, {1, 1}, {1, 1}, {1, 1}, 2),
                        at::conv2d(x, wg, {}, {1, 1}, {1, 1}, {1, 1}, 2)));
  EXPECT_THROW(tuned_conv2d(x, wg, {}, {1, 1}, {1, 1}, {1, 1}, 3), c10::Error);
}

TEST(TunedConvTest, BadGeometryIsNamed) {
  const at::Tensor x = torch::randn({2, 4, 9, 9}), w = torch::randn({6, 4, 3, 3});
  try {
    tuned_conv2d(x, w, {}, {1}, {1, 1}, {1, 1}, 1);
    FAIL() << "one stride for two dimensions was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("two strides"), std::string::npos) << e.what();
  }
}

TEST(TunedConvTest, APlansFileThatCannotBeTrustedIsIgnoredWithANote) {
  if (!conv_with_stats_compiled()) GTEST_SKIP() << "this build has no cuDNN graphs";
  std::string note;
  EXPECT_EQ(load_conv_plans(temporary_path("absent.json"), note), 0);
  EXPECT_TRUE(note.empty()) << note;

  const std::string path = temporary_path("plans.json");
  for (const char* text : {"not json at all", "{\"format\": 1}", "{\"format\": 99, \"cudnn\": 1}",
                           "{\"format\": 1, \"cudnn\": 1, \"frontend\": 1, \"plans\": {}}"}) {
    std::ofstream(path) << text;
    EXPECT_EQ(load_conv_plans(path, note), 0) << text;
    EXPECT_NE(note.find(path), std::string::npos) << text << ": " << note;
  }
  // What this process writes, it reads back (no plans here yet: nothing timed on the CPU).
  clear_conv_plans();
  std::string error;
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  EXPECT_EQ(load_conv_plans(path, note), 0);
  EXPECT_TRUE(note.empty()) << note;
  std::remove(path.c_str());

  EXPECT_FALSE(save_conv_plans("/proc/tandem-cannot-write-here/plans.json", error));
  EXPECT_FALSE(error.empty());
}

// One environment variable set (or unset, with nullptr) for a test, as it was after.
struct EnvSet {
  std::string name;
  std::optional<std::string> was;
  EnvSet(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) was = v;
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~EnvSet() {
    if (was)
      ::setenv(name.c_str(), was->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

TEST(TunedConvTest, TheSharedPlansFileFollowsTheCacheSettings) {
  const EnvSet xdg("XDG_CACHE_HOME", "/xdg"), home("HOME", "/home/someone");
  {
    const EnvSet cache("TANDEM_MODE_CACHE", nullptr);
    EXPECT_EQ(default_conv_plans_path(), "/xdg/tandem/modes/cudnn-plans.json");
    const EnvSet no_xdg("XDG_CACHE_HOME", nullptr);
    EXPECT_EQ(default_conv_plans_path(), "/home/someone/.cache/tandem/modes/cudnn-plans.json");
  }
  {
    const EnvSet cache("TANDEM_MODE_CACHE", "/kept/here");
    EXPECT_EQ(default_conv_plans_path(), "/kept/here/cudnn-plans.json");
  }
  for (const char* off : {"0", "off", "OFF", "false", "no"}) {
    const EnvSet cache("TANDEM_MODE_CACHE", off);
    EXPECT_EQ(default_conv_plans_path(), "") << off;
  }
}

// A scope's plans: a file that cannot be trusted is said, not fatal, and not overwritten where
// the process has nothing new; an empty path keeps nothing.
TEST(TunedConvTest, KeptPlansSayAnUntrustedFileAndWriteNothingNew) {
  if (!conv_with_stats_compiled()) GTEST_SKIP() << "this build has no cuDNN graphs";
  clear_conv_plans();
  const std::string path = temporary_path("scope.json");
  std::ofstream(path) << "not json at all";
  ::testing::internal::CaptureStderr();
  { const KeptConvPlans plans(path); }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("was not used"), std::string::npos) << said;
  EXPECT_NE(said.find(path), std::string::npos) << said;
  std::ifstream in(path);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "not json at all");
  std::remove(path.c_str());
  const KeptConvPlans none("");
  EXPECT_EQ(none.path(), "");
}

// The prebuild's warm-up (TANDEM_KERNEL_WARMUP) runs its ops on a GPU; the sequence itself runs
// anywhere, so the CPU checks that every op of it runs in each dtype and layout a plan may have
// and that it draws nothing from the process's generator.
TEST(TunedConvTest, TheWarmUpsStepRunsInEveryPrecisionAndDrawsNoRandomNumbers) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const bool channels_last : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (channels_last ? " NHWC" : " NCHW"));
      const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
      int64_t ran = 0;
      EXPECT_NO_THROW(ran = detail::run_step_ops(at::TensorOptions(), dtype, channels_last));
      EXPECT_GT(ran, 0);
      EXPECT_TRUE(at::equal(before, at::detail::getDefaultCPUGenerator().get_state()))
          << "the warm-up drew random numbers";
    }
}

// Each shape in half and bfloat16, channels-last and not: LibTorch's values and gradients
// within the dtype's rounding (the plans differ from LibTorch's picks, so not the same bits).
TEST(TunedConvGpuTest, ValuesAndGradientsAreLibTorchsAcrossShapesAndLayouts) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(2);
  for (const auto type : {at::kHalf, at::kBFloat16})
    for (const auto layout : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous})
      for (const Shape& s : kShapes) {
        SCOPED_TRACE(::testing::Message()
                     << c10::toString(type) << " " << layout << " c" << s.c << " k" << s.k << " "
                     << s.kernel << "x" << s.kernel << " stride " << s.stride << " dilation "
                     << s.dilation << " groups " << s.groups);
        const auto [x, w] = operands(s, type, layout);
        const at::Tensor b = s.bias ? torch::randn({s.k}).to(cuda, type) : at::Tensor();
        const Result want = run(false, x, w, b, s, {});
        const at::Tensor dy = torch::randn(want.y.sizes()).to(cuda, type).contiguous(layout);
        const Result ref = run(false, x, w, b, s, dy), got = run(true, x, w, b, s, dy);
        const double tol = type == at::kHalf ? 5e-3 : 3e-2;
        EXPECT_EQ(got.y.scalar_type(), type);
        EXPECT_EQ(got.y.sizes(), ref.y.sizes());
        EXPECT_EQ(got.y.is_contiguous(at::MemoryFormat::ChannelsLast),
                  ref.y.is_contiguous(at::MemoryFormat::ChannelsLast));
        EXPECT_LT(max_relative(got.y, ref.y), tol);
        EXPECT_LT(max_relative(got.dx, ref.dx), tol);
        EXPECT_LT(max_relative(got.dw, ref.dw), tol);
        if (s.bias) {
          EXPECT_LT(max_relative(got.db, ref.db), tol);
        }
      }
  const ConvPlansSummary summary = conv_plans_summary();
  EXPECT_GT(summary.tuned, 0);
  EXPECT_GT(summary.tuning_seconds, 0.0);

  // With cuDNN's benchmark mode off it is LibTorch's convolution: nothing timed.
  at::globalContext().setBenchmarkCuDNN(false);
  const Shape& s = kShapes[1];
  const at::Tensor x = torch::randn({s.n, s.c, 9, 9}).to(cuda, at::kHalf);
  const at::Tensor w = torch::randn({s.k, s.c, 1, 1}).to(cuda, at::kHalf);
  const std::vector<int64_t> one{1, 1}, zero{0, 0};
  EXPECT_TRUE(at::equal(tuned_conv2d(x, w, {}, one, zero, one, 1),
                        at::conv2d(x, w, {}, one, zero, one, 1)));
  EXPECT_EQ(conv_plans_summary().tuned, summary.tuned);
}

// The sums' graph with kept plans behind it: its gradients come from the input- and weight-
// gradient plans (the process's plan count grows by them) and are LibTorch's backward's within
// half's rounding, as without them.
TEST(TunedConvGpuTest, TheSumsGraphsGradientsComeFromTheKeptPlans) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  torch::manual_seed(16);
  const at::Tensor x0 = torch::rand({8, 32, 14, 14}).to(cuda, at::kHalf).contiguous(cl);
  const at::Tensor w0 = (torch::randn({48, 32, 3, 3}) * 0.08).to(cuda, at::kHalf).contiguous(cl);
  const at::Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
  const at::Tensor ref = at::conv2d(xr, wr, {}, {2, 2}, {1, 1});
  const at::Tensor dy = torch::randn(ref.sizes()).to(cuda, at::kHalf).contiguous(cl);
  ref.backward(dy);
  clear_conv_plans();  // this shape's passes new to the table, however often the test runs
  const auto planned = [] {
    const ConvPlansSummary s = conv_plans_summary();
    return s.tuned + s.from_file + s.untimed;
  };
  for (const bool kept : {false, true}) {
    SCOPED_TRACE(kept ? "on kept plans" : "LibTorch's backward");
    const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const ConvAndSums out = conv2d_with_stats(x, w, {2, 2}, {1, 1}, true, kept);
    ASSERT_TRUE(out.sums.defined());
    const int64_t before = planned();
    out.y.backward(dy);
    EXPECT_EQ(planned() - before, kept ? 2 : 0);  // the input- and the weight-gradient pass
    EXPECT_LT(max_relative(x.grad(), xr.grad()), 5e-3);
    EXPECT_LT(max_relative(w.grad(), wr.grad()), 5e-3);
  }
}

// float32 operands under autocast: cast as LibTorch's convolution casts them, its output
// bfloat16, the weight's gradient back in float32.
TEST(TunedConvGpuTest, AutocastCastsAsLibTorchsConvolutionDoes) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(3);
  const Shape s = kShapes[2];
  const at::Tensor x =
      torch::randn({s.n, s.c, s.size, s.size}, cuda).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor w = torch::randn({s.k, s.c, 3, 3}, cuda) * 0.1;
  Result got, want;
  {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    got = run(true, x, w, {}, s, {});
    want = run(false, x, w, {}, s, {});
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(got.y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.dw.scalar_type(), at::kFloat);
  EXPECT_EQ(got.dx.scalar_type(), at::kFloat);
  EXPECT_LT(max_relative(got.y, want.y), 3e-2);
  EXPECT_LT(max_relative(got.dw, want.dw), 3e-2);
}

// Timed once for the process whichever thread runs the shape first; after a save and a clear
// (a later process, as far as the plans know), a load brings every plan back untimed.
TEST(TunedConvGpuTest, PlansAreTimedOncePerProcessAndComeBackFromTheFile) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  clear_conv_plans();
  const Shape s{8, 48, 48, 12, 3, 1, 1, 1, false};
  const auto [x, w] = operands(s, at::kHalf);
  const Result first = run(true, x, w, {}, s, {});
  const ConvPlansSummary timed = conv_plans_summary();
  EXPECT_EQ(timed.tuned, 3);  // forward, input and weight gradient
  // Where the tuning's seconds went, accounted: its graphs and lists, its plans built.
  EXPECT_GT(timed.listing_seconds, 0.0);
  EXPECT_GT(timed.building_seconds, 0.0);
  EXPECT_LE(timed.listing_seconds + timed.building_seconds, timed.tuning_seconds);
  std::thread other([&] {
    c10::cuda::CUDAGuard device(cuda);
    run(true, x, w, {}, s, {});
  });
  other.join();
  EXPECT_EQ(conv_plans_summary().tuned, 3) << "another thread timed the shape again";

  const std::string path = temporary_path("kept.json");
  std::string error, note;
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  clear_conv_plans();
  EXPECT_EQ(load_conv_plans(path, note), 3);
  EXPECT_TRUE(note.empty()) << note;
  const Result again = run(true, x, w, {}, s, {});
  const ConvPlansSummary after = conv_plans_summary();
  EXPECT_EQ(after.tuned, 0);
  EXPECT_EQ(after.from_file, 3);
  EXPECT_GT(after.rebuilding_seconds, 0.0);
  EXPECT_GT(after.configured, 0) << "no kept engine was configured from its knobs: every "
                                    "rebuild asked cuDNN's candidate lists";
  // What a shape's plans cost on this GPU, for the log (timings belong in benchmarks, not here).
  std::printf(
      "plans: 3 tuned in %.4f s (listing %.4f, building %.4f); 3 rebuilt in %.4f s "
      "(listing %.4f, building %.4f; %lld configured without the lists)\n",
      timed.tuning_seconds, timed.listing_seconds, timed.building_seconds, after.rebuilding_seconds,
      after.listing_seconds, after.building_seconds, static_cast<long long>(after.configured));
  EXPECT_LE(after.listing_seconds + after.building_seconds, after.rebuilding_seconds);
  EXPECT_GT(after.graph_seconds, 0.0);  // the operation graphs, a part of the listing
  EXPECT_LE(after.graph_seconds, after.listing_seconds);
  EXPECT_LT(max_relative(again.y, first.y), 1e-3);
  EXPECT_LT(max_relative(again.dw, first.dw), 5e-3);
  std::remove(path.c_str());
}

// A plan whose engine compiles its kernel at run time (cuDNN's fast depthwise engines) comes
// back from the file with its compiled code, compiling nothing; where that code is not taken
// back, the choice is found in cuDNN's lists and compiled again.
TEST(TunedConvGpuTest, RuntimeCompiledPlansComeBackWithTheirCode) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  torch::manual_seed(6);
  clear_conv_plans();
  // MobileNet-like depthwise passes, large enough that a compiled engine is the fastest.
  const Shape shapes[] = {{32, 96, 96, 28, 3, 1, 1, 1, false, 96},
                          {32, 96, 96, 28, 5, 2, 2, 1, false, 96}};
  std::vector<at::Tensor> xs, ws;
  std::vector<Result> first;
  for (const Shape& s : shapes) {
    const auto [x, w] = operands(s, at::kBFloat16);
    xs.push_back(x);
    ws.push_back(w);
    first.push_back(run(true, xs.back(), ws.back(), {}, s, {}));
  }
  const ConvPlansSummary timed = conv_plans_summary();
  ASSERT_EQ(timed.tuned, 6);
  std::printf("depthwise plans: %lld of 6 compiled at run time\n",
              static_cast<long long>(timed.runtime_compiled));

  const std::string path = temporary_path("compiled.json");
  std::string error, note;
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  const auto again = [&](const char* what) {
    clear_conv_plans();
    EXPECT_EQ(load_conv_plans(path, note), 6) << what;
    EXPECT_TRUE(note.empty()) << note;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Result r = run(true, xs[i], ws[i], {}, shapes[i], {});
      EXPECT_LT(max_relative(r.y, first[i].y), 1e-3) << what;
      EXPECT_LT(max_relative(r.dw, first[i].dw), 5e-3) << what;
    }
    const ConvPlansSummary s = conv_plans_summary();
    EXPECT_EQ(s.tuned, 0) << what;
    EXPECT_EQ(s.from_file, 6) << what;
    return s;
  };
  const ConvPlansSummary restored = again("restored");
  EXPECT_EQ(restored.from_compiled, timed.runtime_compiled);
  EXPECT_EQ(restored.runtime_compiled, 0);

  {  // compiled code this cuDNN does not take back
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& [key, v] : j.at("plans").items())
      if (v.contains("plan")) v["plan"] = {{"not", "a plan"}};
    std::ofstream(path) << j.dump();
  }
  const ConvPlansSummary relisted = again("relisted");
  EXPECT_EQ(relisted.from_compiled, 0);
  EXPECT_EQ(relisted.runtime_compiled, timed.runtime_compiled);
  // What they cost on this GPU, for the log (timings belong in benchmarks, not here).
  std::printf(
      "6 plans: timed in %.3f s (building %.3f), restored in %.3f s, rebuilt from the "
      "lists in %.3f s (building %.3f)\n",
      timed.tuning_seconds, timed.building_seconds, restored.rebuilding_seconds,
      relisted.rebuilding_seconds, relisted.building_seconds);
  std::remove(path.c_str());
  if (timed.runtime_compiled == 0)
    GTEST_SKIP() << "cuDNN picked no runtime-compiled plan for these shapes on this GPU: the "
                    "compiled code's way back went unexercised";
}

// The plans a job used come back built ahead on threads, before any call: each shape's first
// call then builds nothing and computes the timed plans' values. Another job's plans are not
// built; a file an older build wrote (no operands) leaves every plan to its first call, which
// notes its operands for the next save.
TEST(TunedConvGpuTest, AJobsKeptPlansAreBuiltAheadOnThreads) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  torch::manual_seed(8);
  clear_conv_plans();
  const Shape shapes[] = {kShapes[1], kShapes[2], kShapes[3]};  // a 1x1, a 3x3, a strided 3x3
  std::vector<at::Tensor> xs, ws;
  std::vector<Result> first;
  set_conv_plans_job("job a");
  for (const Shape& s : shapes) {
    const auto [x, w] = operands(s, at::kHalf);
    xs.push_back(x);
    ws.push_back(w);
    first.push_back(run(true, xs.back(), ws.back(), {}, s, {}));
  }
  set_conv_plans_job("");
  const int64_t planned = conv_plans_summary().tuned;  // three passes a shape, where cuDNN has them
  ASSERT_GT(planned, 0);
  EXPECT_TRUE(conv_plans_unsaved());
  const std::string path = temporary_path("jobs.json");
  std::string error, note;
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  EXPECT_FALSE(conv_plans_unsaved());

  clear_conv_plans();
  EXPECT_EQ(load_conv_plans(path, note), planned);
  EXPECT_EQ(prebuild_conv_plans("job b", 4), 0) << "another job's plans were built";
  EXPECT_EQ(prebuild_conv_plans("job a", 4), planned);
  EXPECT_EQ(prebuild_conv_plans("job a", 4), 0) << "built twice";
  const ConvPlansSummary ahead = conv_plans_summary();
  EXPECT_EQ(ahead.prebuilt, planned);
  EXPECT_EQ(ahead.from_file, planned);
  EXPECT_GT(ahead.rebuilding_seconds, 0.0);
  for (size_t i = 0; i < xs.size(); ++i) {
    const Result r = run(true, xs[i], ws[i], {}, shapes[i], {});
    EXPECT_LT(max_relative(r.y, first[i].y), 1e-3) << "shape " << i;
    EXPECT_LT(max_relative(r.dw, first[i].dw), 5e-3) << "shape " << i;
    EXPECT_LT(max_relative(r.dx, first[i].dx), 5e-3) << "shape " << i;
  }
  const ConvPlansSummary used = conv_plans_summary();
  EXPECT_EQ(used.from_file, planned) << "a call built a plan the prebuild had built";
  EXPECT_EQ(used.tuned, 0);
  std::printf("%lld plans built ahead on 4 threads in %.4f s (configured %lld)\n",
              static_cast<long long>(planned), ahead.rebuilding_seconds,
              static_cast<long long>(ahead.configured));

  {  // as an older build wrote it: no operands, no jobs
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& [key, v] : j.at("plans").items()) {
      ASSERT_TRUE(v.contains("operands")) << key;
      ASSERT_EQ(v.at("jobs"), nlohmann::json::array({"job a"})) << key;
      v.erase("operands");
      v.erase("jobs");
    }
    std::ofstream(path) << j.dump();
  }
  clear_conv_plans();
  EXPECT_EQ(load_conv_plans(path, note), planned);
  EXPECT_EQ(prebuild_conv_plans("job a", 4), 0);
  set_conv_plans_job("job a");
  for (size_t i = 0; i < xs.size(); ++i) run(true, xs[i], ws[i], {}, shapes[i], {});
  set_conv_plans_job("");
  EXPECT_EQ(conv_plans_summary().from_file, planned);
  EXPECT_TRUE(conv_plans_unsaved()) << "the operands and the job were not noted";
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  std::ifstream in(path);
  for (const auto& [key, v] : nlohmann::json::parse(in).at("plans").items()) {
    EXPECT_TRUE(v.contains("operands")) << key;
    EXPECT_TRUE(v.contains("jobs")) << key;
  }
  std::remove(path.c_str());
}

// The prebuild's one more thread with TANDEM_KERNEL_WARMUP=1, which loads a training step's
// other kernels (batch norm, pooling, cuBLAS, the loss, SGD's updates) while the plans build,
// finishes its ops before the prebuild returns and leaves the run as it was: the process's
// random numbers the same as without it (the default).
TEST(TunedConvGpuTest, ThePrebuildLoadsTheStepsOtherKernelsAndLeavesTheRunAsItWas) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(9);
  clear_conv_plans();
  const Shape& s = kShapes[2];
  const auto [x, w] = operands(s, at::kBFloat16);
  set_conv_plans_job("job w");
  run(true, x, w, {}, s, {});
  set_conv_plans_job("");
  const std::string path = temporary_path("warmup.json");
  std::string error, note;
  ASSERT_TRUE(save_conv_plans(path, error)) << error;
  const int64_t planned = conv_plans_summary().tuned;
  ASSERT_GT(planned, 0);

  const auto prebuilt = [&](const char* warmup) {
    const EnvSet set("TANDEM_KERNEL_WARMUP", warmup);
    clear_conv_plans();
    EXPECT_EQ(load_conv_plans(path, note), planned) << note;
    const ConvPlansSummary before = conv_plans_summary();
    torch::manual_seed(10);
    EXPECT_EQ(prebuild_conv_plans("job w", 2), planned);
    const at::Tensor drawn = torch::randn({64}, torch::TensorOptions().device(cuda));
    ConvPlansSummary after = conv_plans_summary();
    after.warmup_ops -= before.warmup_ops;
    after.warmup_seconds -= before.warmup_seconds;
    return std::make_pair(after, drawn.cpu());
  };
  const auto [on, drawn_on] = prebuilt("1");
  EXPECT_GT(on.warmup_ops, 0)
      << "the step's other kernels were not run (or it stopped on an error)";
  EXPECT_GT(on.warmup_seconds, 0.0);
  const auto [off, drawn_off] = prebuilt(nullptr);
  EXPECT_EQ(off.warmup_ops, 0) << "it ran without TANDEM_KERNEL_WARMUP";
  EXPECT_EQ(off.warmup_seconds, 0.0);
  EXPECT_TRUE(torch::equal(drawn_on, drawn_off)) << "the prebuild drew random numbers";
  std::printf("the step's other kernels: %lld ops in %.4f s beside %lld plans\n",
              static_cast<long long>(on.warmup_ops), on.warmup_seconds,
              static_cast<long long>(planned));
  std::remove(path.c_str());
}

// Depthwise and grouped convolutions take cuDNN's plans too (not LibTorch's convolution behind
// the same values): every pass of each shape planned, none refused.
TEST(TunedConvGpuTest, DepthwiseAndGroupedConvolutionsGetPlans) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  torch::manual_seed(5);
  int64_t planned = 0;
  for (const Shape& s : kShapes) {
    if (s.groups == 1) continue;
    clear_conv_plans();
    const auto [x, w] = operands(s, at::kBFloat16);
    run(true, x, w, {}, s, {});
    const ConvPlansSummary summary = conv_plans_summary();
    EXPECT_EQ(summary.tuned, 3) << "groups " << s.groups << " c" << s.c;
    EXPECT_EQ(summary.refused, 0) << "groups " << s.groups << " c" << s.c;
    planned += summary.tuned;
  }
  EXPECT_GT(planned, 0);
}

// Under capture nothing may wait for the stream: an unseen shape takes cuDNN's first choice
// untimed, and the replayed graph computes the convolution.
TEST(TunedConvGpuTest, UnderCaptureAnUnseenShapeRunsUntimed) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  clear_conv_plans();
  torch::manual_seed(4);
  const at::Tensor x =
      torch::randn({4, 24, 10, 10}).to(cuda, at::kHalf).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor w = (torch::randn({40, 24, 3, 3}) * 0.1)
                           .to(cuda, at::kHalf)
                           .contiguous(at::MemoryFormat::ChannelsLast);
  // Outside capture first, as a training loop's eager steps before capture do: LibTorch's
  // convolution here makes this thread's cuDNN handle, whose creation allocates and so cannot
  // happen under capture (LibTorch's own convolution fails there too).
  const at::Tensor expected = at::conv2d(x, w, {}, {1, 1}, {1, 1});
  at::Tensor y;
  at::cuda::CUDAGraph graph;
  {
    const at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, 0);
    at::cuda::getCurrentCUDAStream(0).synchronize();  // x and w made there
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    y = tuned_conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, 1);
    graph.capture_end();
  }
  graph.replay();
  at::cuda::getCurrentCUDAStream(0).synchronize();
  const ConvPlansSummary summary = conv_plans_summary();
  EXPECT_EQ(summary.untimed, 1);
  EXPECT_EQ(summary.tuned, 0);
  EXPECT_LT(max_relative(y, expected), 5e-3);
}

// The trained ResNets' convolutions on kept plans (ResNetOptions::kept_conv_plans, with
// cuDNN's benchmark mode on): a ResNet-18's training step in bf16 is as near the float32 step
// as at::conv2d's bf16 step is — loss, every gradient and running statistic. Not near each
// other by a fixed bound: at initialization the batch norms' backward takes nearly equal
// quantities apart, so bf16's rounding moves every layer's gradient ~15% (of its norm) whichever
// kernels round it; a wrong plan's gradient would be as far as the gradient itself.
TEST(TunedConvGpuTest, ATrainedResNetOnKeptPlansIsAsNearTheFloat32StepAsLibTorchs) {
  TANDEM_SKIP_WITHOUT_CUDA();
  if (!conv_with_stats_compiled()) GTEST_SKIP() << "this build has no cuDNN graphs";
  const BenchmarkModeOn benchmark;
  clear_conv_plans();
  auto steps = [](bool plans, Precision precision) {
    ResNetOptions options;
    options.num_classes = 10;
    options.kept_conv_plans = plans;
    return test_steps::resnet_step(resnet18, options, precision);
  };
  const test_steps::ResNetStep kept = steps(true, Precision::kBf16);
  const ConvPlansSummary used = conv_plans_summary();
  EXPECT_GT(used.tuned, 0) << "the ResNet's convolutions took no kept plan";
  const test_steps::ResNetStep libtorch = steps(false, Precision::kBf16);
  EXPECT_EQ(conv_plans_summary().tuned, used.tuned) << "at::conv2d's step took kept plans";
  at::globalContext().setAllowTF32CuDNN(false);  // float32 convolutions, not TF32
  const test_steps::ResNetStep exact = steps(false, Precision::kFp32);
  at::globalContext().setAllowTF32CuDNN(true);

  // How far a from the float32 step's e, relative to e's norm.
  const auto off = [](const at::Tensor& a, const at::Tensor& e) {
    const at::Tensor ad = a.to(at::kDouble), ed = e.to(at::kDouble);
    return (ad - ed).norm().item<double>() / std::max(ed.norm().item<double>(), 1e-12);
  };
  EXPECT_LT(off(kept.loss, exact.loss), 1.5 * off(libtorch.loss, exact.loss) + 2e-3);
  ASSERT_EQ(kept.grads.size(), exact.grads.size());
  double worst = 0.0;
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    ASSERT_TRUE(kept.grads[i].second.defined()) << kept.grads[i].first;
    const double k = off(kept.grads[i].second, exact.grads[i].second),
                 l = off(libtorch.grads[i].second, exact.grads[i].second);
    EXPECT_LT(k, 1.5 * l + 0.02) << "bf16 gradient of " << kept.grads[i].first << ": kept plans "
                                 << k << " from float32's, at::conv2d " << l;
    worst = std::max(worst, k);
  }
  for (size_t i = 0; i < kept.buffers.size(); ++i)
    EXPECT_LT(off(kept.buffers[i].second, exact.buffers[i].second),
              1.5 * off(libtorch.buffers[i].second, exact.buffers[i].second) + 2e-3)
        << "bf16 " << kept.buffers[i].first;
  std::printf("kept plans' bf16 gradients: at most %.3f of their norm from float32's\n", worst);
}

TEST(TunedConvGpuTest, AnEvaluationRunsOnItsTrainingsPlans) {
  TANDEM_SKIP_WITHOUT_CUDA();
  if (!conv_with_stats_compiled()) GTEST_SKIP() << "this build has no cuDNN graphs";
  const BenchmarkModeOn benchmark;
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(3);
  const at::Tensor x =
      torch::randn({8, 3, 64, 64}, cuda).contiguous(at::MemoryFormat::ChannelsLast);
  auto net_with = [&](bool plans) {
    torch::manual_seed(4);
    ResNetOptions options;
    options.num_classes = 10;
    options.kept_conv_plans = plans;
    ResNet net = resnet18(options);
    net->to(cuda);
    to_channels_last(*net);
    return net;
  };
  auto evaluate = [&](ResNet& net) {
    net->eval();
    torch::NoGradGuard no_grad;
    AutocastScope autocast(cuda, Precision::kBf16);
    const at::Tensor logits = net->forward(x).to(at::kFloat);
    net->train();
    return logits;
  };

  // On its own, the evaluation's convolutions take plans (timed here: none kept yet).
  clear_conv_plans();
  ResNet kept = net_with(true);
  const at::Tensor on_plans = evaluate(kept);
  EXPECT_GT(conv_plans_summary().tuned, 0) << "the evaluation took no kept plan";

  // After a training step of the same shapes it times nothing new: its plans are the step's.
  clear_conv_plans();
  {
    AutocastScope autocast(cuda, Precision::kBf16);
    kept->forward(x).to(at::kFloat).sum().backward();
  }
  const ConvPlansSummary trained = conv_plans_summary();
  ASSERT_GT(trained.tuned, 0) << "the training step took no kept plan";
  kept->zero_grad();
  evaluate(kept);
  EXPECT_EQ(conv_plans_summary().tuned, trained.tuned)
      << "the evaluation timed shapes its training step had already timed";

  // The same logits as at::conv2d's evaluation of the same weights, within bf16's rounding.
  ResNet libtorch = net_with(false);
  EXPECT_LT(max_relative(on_plans, evaluate(libtorch)), 5e-2);
}

}  // namespace tuned_conv_test
}  // namespace tandem::models
