// LossScale: the loss scaled, the gradients unscaled and checked, the scale backing off after an
// overflow and growing after a run of clean steps (GradScaler's arithmetic), all in device
// tensors; bad options named.
#include "tandem/loss_scale.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace {

// A parameter with gradient `grad`.
at::Tensor with_grad(const at::Tensor& grad) {
  at::Tensor p = at::zeros_like(grad).requires_grad_();
  p.mutable_grad() = grad.clone();
  return p;
}

void expect_scaling_on(c10::Device device) {
  LossScaleOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScale s(device, o);
  const at::Tensor loss = at::full({}, 0.5, at::TensorOptions().device(device));
  EXPECT_EQ(s.scaled(loss).item<double>(), 512.0);
  EXPECT_EQ(s.scaled(loss).dim(), 0) << "a scalar loss stays a scalar";

  // Clean gradients: divided by the scale, no overflow; the third clean step in a row doubles
  // the scale.
  const auto f32 = at::TensorOptions().device(device);
  std::vector<at::Tensor> params{with_grad(at::full({4}, 2048.0, f32)),
                                 with_grad(at::full({2, 3}, -512.0, f32)),
                                 at::zeros({3}, f32).requires_grad_()};  // no gradient: skipped
  s.unscale(params);
  EXPECT_EQ(s.found_inf().item<float>(), 0.f);
  EXPECT_TRUE(params[0].grad().equal(at::full({4}, 2.0, f32)));
  EXPECT_TRUE(params[1].grad().equal(at::full({2, 3}, -0.5, f32)));
  EXPECT_FALSE(params[2].grad().defined());
  for (int step = 0; step < 2; ++step) {
    s.update();
    EXPECT_EQ(s.scale(), 1024.0) << "clean step " << step + 1 << " of 3";
  }
  s.update();
  EXPECT_EQ(s.scale(), 2048.0) << "the third clean step in a row grows the scale";

  // An inf or a NaN anywhere: found, and the scale backs off (the run of clean steps restarts).
  for (const double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    std::vector<at::Tensor> overflowed{with_grad(at::ones({4}, f32)),
                                       with_grad(at::full({2}, bad, f32))};
    s.unscale(overflowed);
    EXPECT_EQ(s.found_inf().item<float>(), 1.f) << bad;
    const double before = s.scale();
    s.update();
    EXPECT_EQ(s.scale(), before / 2) << bad;
  }
  s.unscale({with_grad(at::ones({4}, f32))});
  EXPECT_EQ(s.found_inf().item<float>(), 0.f) << "found_inf is this unscale's, not sticky";
  const auto state = s.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "scale");
  EXPECT_EQ(state[1].first, "growth_tracker");
}

TEST(LossScaleTest, ScalesUnscalesChecksAndUpdatesAsGradScaler) {
  expect_scaling_on(c10::Device(c10::kCPU));
}

TEST(LossScaleGpuTest, ScalesUnscalesChecksAndUpdatesAsGradScaler) {
  TANDEM_SKIP_WITHOUT_CUDA();
  expect_scaling_on(c10::Device(c10::kCUDA, 0));
}

// A saved state goes into another loss scale (a resumed run continues the scale); one that
// does not fit is refused naming each problem, and nothing is copied.
TEST(LossScaleTest, ASavedStateLoadsAndOneThatDoesNotFitIsNamed) {
  const c10::Device cpu(c10::kCPU);
  LossScaleOptions o;
  o.init_scale = 8;
  LossScale saved(cpu, o);
  saved.unscale({with_grad(at::full({2}, std::numeric_limits<double>::infinity()))});
  saved.update();  // backed off: 4
  LossScale resumed(cpu);
  resumed.load_state(saved.state());
  EXPECT_EQ(resumed.scale(), 4.0);
  try {
    resumed.load_state({{"scale", at::ones({2})}, {"growth", at::zeros({1}, at::kInt)}});
    ADD_FAILURE() << "a state that does not fit was taken";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'scale' has shape [2], expected [1]"), std::string::npos) << what;
    EXPECT_NE(what.find("unexpected 'growth'"), std::string::npos) << what;
    EXPECT_NE(what.find("missing 'growth_tracker'"), std::string::npos) << what;
  }
  EXPECT_EQ(resumed.scale(), 4.0) << "nothing copied from a state that does not fit";
}

TEST(LossScaleTest, BadOptionsAreNamed) {
  auto message = [](LossScaleOptions o) {
    try {
      LossScale s(c10::Device(c10::kCPU), o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LossScaleOptions o;
  o.init_scale = 0;
  EXPECT_NE(message(o).find("loss scale 0 is not valid"), std::string::npos) << message(o);
  o = {};
  o.growth_factor = 1;
  EXPECT_NE(message(o).find("growth factor 1 is not valid"), std::string::npos) << message(o);
  o = {};
  o.backoff_factor = 1;
  EXPECT_NE(message(o).find("backoff factor 1 is not valid"), std::string::npos) << message(o);
  o = {};
  o.growth_interval = 0;
  EXPECT_NE(message(o).find("growth interval 0 is not valid"), std::string::npos) << message(o);
}

}  // namespace
}  // namespace tandem
