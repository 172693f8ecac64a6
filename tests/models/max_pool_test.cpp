// max_pool_3x3_stride2 against torch's max_pool2d(x, 3, 2, 1): the same outputs and the same
// gradients, in every dtype tandem's kernels take, on odd and even sides (the padded border),
// with ties (which position takes the gradient) and with NaN; torch's own op where they do not
// apply (the CPU, NCHW, channel counts that are not whole vectors).
#include "tandem/models/max_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "tandem/error.h"
#include "test_util.h"

namespace tandem::models {
namespace {

struct Outcome {
  at::Tensor y, dx;
};

Outcome run(const at::Tensor& x0, const at::Tensor& dy, bool ours) {
  const at::Tensor x = x0.clone().requires_grad_();
  const at::Tensor y = ours ? max_pool_3x3_stride2(x) : at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  y.backward(dy);
  return {y.detach(), x.grad()};
}

void expect_same(const at::Tensor& x, const std::string& what) {
  SCOPED_TRACE(what);
  torch::manual_seed(3);
  const at::Tensor probe = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  const at::Tensor dy =
      torch::randn(probe.sizes(), x.options()).contiguous(probe.suggest_memory_format());
  const Outcome ours = run(x, dy, true), theirs = run(x, dy, false);
  ASSERT_EQ(ours.y.sizes(), theirs.y.sizes());
  // The maximum is one of the inputs: exactly equal, NaN where torch has NaN.
  EXPECT_TRUE(at::equal(ours.y.isnan(), theirs.y.isnan()));
  EXPECT_TRUE(at::equal(ours.y.nan_to_num(0), theirs.y.nan_to_num(0)));
  // Each input's gradient sums at most four outputs' (in float32 on both sides): the same
  // placements, values equal up to the order of that sum.
  EXPECT_TRUE(at::equal(ours.dx != 0, theirs.dx != 0));
  const double scale = std::max(theirs.dx.abs().max().item<double>(), 1e-12);
  EXPECT_LT(
      (ours.dx.to(at::kDouble) - theirs.dx.to(at::kDouble)).abs().max().item<double>() / scale,
      x.scalar_type() == at::kFloat ? 1e-6 : 1e-2);
  EXPECT_EQ(ours.dx.suggest_memory_format(), x.suggest_memory_format());
}

TEST(MaxPoolTest, IsTorchsOpWhereItsKernelsDoNotApply) {
  const at::Tensor x = torch::randn({2, 5, 9, 7});
  expect_same(x, "cpu nchw");
  expect_same(x.contiguous(at::MemoryFormat::ChannelsLast), "cpu channels-last");
  EXPECT_THROW(max_pool_3x3_stride2(torch::randn({5, 9, 7})), InvalidArgument);
}

TEST(MaxPoolGpuTest, MatchesTorchInEveryDtypeTiesAndNan) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const std::string name = c10::toString(dtype);
    const auto cl = at::MemoryFormat::ChannelsLast;
    const auto opts = torch::TensorOptions(cuda).dtype(dtype);
    expect_same(torch::randn({4, 64, 112, 112}, opts).contiguous(cl), name + " stem-sized");
    expect_same(torch::randn({3, 16, 9, 7}, opts).contiguous(cl), name + " odd sides");
    expect_same(torch::randn({2, 8, 1, 2}, opts).contiguous(cl), name + " one row");
    // Few distinct values: most windows hold their maximum more than once.
    expect_same(torch::randint(0, 3, {2, 32, 10, 12}, opts).contiguous(cl), name + " ties");
    at::Tensor with_nan = torch::randn({2, 16, 8, 8}, opts);
    with_nan.view(-1).index_put_({torch::tensor({5, 77, 300, 301, 1000})}, NAN);
    expect_same(with_nan.contiguous(cl), name + " NaN");
    expect_same(torch::randn({2, 6, 9, 9}, opts).contiguous(cl),
                name + " channels not whole vectors");
    expect_same(torch::randn({2, 16, 9, 9}, opts), name + " nchw");
  }
}

}  // namespace
}  // namespace tandem::models
