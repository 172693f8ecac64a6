// GatheredGrad: with no data parallel it is the wrapped layer (same forward, same gradients,
// same state-dict names); with a sync of two ranks its backward gives this rank's input
// gradient and the mean of both ranks' weight and bias gradients, as an all-reduce of the
// layers' own gradients would — for Linear, patch Conv2d and patch ConvTranspose2d. The other
// rank is played by a GradientSync that appends its rows.
#include "tandem/gathered_grad.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>

#include "tandem/detail/gradient_sync.h"
#include "test_util.h"

namespace tandem {
namespace {

// Rank 0 of a world of two whose rank 1 holds `other` (its inputs and output gradients).
class TwoRankSync : public GradientSync {
 public:
  explicit TwoRankSync(std::vector<at::Tensor> other) : other_(std::move(other)) {}
  void before_backward() override {}
  void after_backward() override {}
  std::string what() const override { return "two ranks, in one process"; }
  int world_size() const override { return 2; }
  bool gathers_layer_batches() const override { return true; }
  std::vector<at::Tensor> all_gather_batch(const std::vector<at::Tensor>& local) override {
    ++calls;
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < local.size(); ++i) out.push_back(at::cat({local[i], other_[i]}));
    return out;
  }
  int calls = 0;

 private:
  std::vector<at::Tensor> other_;
};

// The layer's own gradients for input x and output gradient g (loss = sum(y * g)).
struct Grads {
  at::Tensor x, w, b;
};
Grads own_grads(const std::function<at::Tensor(const at::Tensor&)>& layer, torch::nn::Module& m,
                const at::Tensor& x, const at::Tensor& g) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  const at::Tensor xi = x.detach().requires_grad_(true);
  (layer(xi) * g).sum().backward();
  auto named = m.named_parameters();
  const at::Tensor* b = named.find("bias");
  return {xi.grad().clone(), named["weight"].grad().clone(),
          b != nullptr && b->defined() ? b->grad().clone() : at::Tensor()};
}

// Checks GatheredGrad(layer) against the layer on inputs of `shape`, rank 1's rows included.
template <typename Layer>
void check_against_layer(Layer layer, std::vector<int64_t> shape,
                         c10::Device device = c10::Device(c10::kCPU)) {
  at::manual_seed(5);
  layer->to(device, at::kDouble);
  GatheredGrad wrapped(layer);
  const auto options = at::TensorOptions(device).dtype(at::kDouble);
  const at::Tensor x0 = at::randn(shape, options), x1 = at::randn(shape, options);
  const at::Tensor y = layer->forward(x0);
  const at::Tensor g0 = at::randn_like(y), g1 = at::randn_like(y);
  auto plain = [&](const at::Tensor& x) { return layer->forward(x); };
  const Grads r0 = own_grads(plain, *layer, x0, g0), r1 = own_grads(plain, *layer, x1, g1);

  // No sync: the layer itself, bit for bit.
  auto through = [&](const at::Tensor& x) { return wrapped->forward(x); };
  const Grads alone = own_grads(through, *wrapped, x0, g0);
  EXPECT_TRUE(at::equal(wrapped->forward(x0), y));
  EXPECT_TRUE(at::equal(alone.x, r0.x));
  EXPECT_TRUE(at::equal(alone.w, r0.w));

  // Two ranks: this rank's input gradient, both ranks' mean weight and bias gradients.
  TwoRankSync sync({x1, g1});
  Grads both;
  {
    GradientSync::Scope scope(&sync);
    EXPECT_TRUE(at::allclose(wrapped->forward(x0), y, 0, 0));
    both = own_grads(through, *wrapped, x0, g0);
  }
  EXPECT_EQ(sync.calls, 1);
  EXPECT_TRUE(at::allclose(both.x, r0.x, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(both.w, (r0.w + r1.w) / 2, 1e-10, 1e-12))
      << (both.w - (r0.w + r1.w) / 2).abs().max();
  ASSERT_EQ(both.b.defined(), r0.b.defined());
  if (both.b.defined()) {
    EXPECT_TRUE(at::allclose(both.b, (r0.b + r1.b) / 2, 1e-10, 1e-12));
  }
}

TEST(GatheredGradTest, LinearMatchesTheMeanOfTheRanksGradients) {
  check_against_layer(torch::nn::Linear(5, 7), {4, 3, 5});  // rows beyond the batch dim too
}

TEST(GatheredGradTest, LinearWithoutBias) {
  check_against_layer(torch::nn::Linear(torch::nn::LinearOptions(5, 7).bias(false)), {4, 5});
}

TEST(GatheredGradTest, PatchConvMatchesTheMeanOfTheRanksGradients) {
  // 5 x 7 input, kernel 2: the last row and column are not read, as in the conv itself.
  check_against_layer(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 2).stride(2)), {2, 3, 5, 7});
}

TEST(GatheredGradTest, PatchConvTransposeMatchesTheMeanOfTheRanksGradients) {
  check_against_layer(
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 3, 2).stride(2)),
      {2, 4, 3, 2});
  // seg's first decoder layer, in small: a 1 x 1 input.
  check_against_layer(
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 6, 2).stride(2)),
      {3, 8, 1, 1});
}

// On CUDA the conv kinds' weight gradients go through cuDNN (a 1x1 convolution), not at::mm.
TEST(GatheredGradGpuTest, PatchConvsMatchTheMeanOfTheRanksGradientsOnCuda) {
  TANDEM_SKIP_WITHOUT_CUDA();
  testing::use_deterministic_algorithms();  // the layer's own gradients, twice alike
  const c10::Device cuda(c10::kCUDA, 0);
  check_against_layer(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 2).stride(2)), {2, 3, 5, 7},
                      cuda);
  check_against_layer(
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 6, 2).stride(2)),
      {3, 8, 1, 1}, cuda);
  check_against_layer(torch::nn::Linear(5, 7), {4, 3, 5}, cuda);
}

// Under autocast the forward runs in bfloat16 and its output gradient comes back in it; the
// gradients still come out in the parameters' and input's dtypes, near the layer's own.
TEST(GatheredGradTest, AutocastGivesGradientsInTheParametersDtype) {
  at::manual_seed(5);
  torch::nn::Linear layer(16, 8);
  GatheredGrad wrapped(layer);
  const at::Tensor x0 = at::randn({4, 16}), x1 = at::randn({4, 16});
  const at::Tensor g0 = at::randn({4, 8}), g1 = at::randn({4, 8});
  auto plain = [&](const at::Tensor& x) { return layer->forward(x); };
  auto through = [&](const at::Tensor& x) { return wrapped->forward(x); };
  const Grads r0 = own_grads(plain, *layer, x0, g0), r1 = own_grads(plain, *layer, x1, g1);
  TwoRankSync sync({x1, g1});
  Grads both;
  {
    GradientSync::Scope scope(&sync);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    EXPECT_EQ(wrapped->forward(x0).scalar_type(), at::kBFloat16);
    both = own_grads(through, *wrapped, x0, g0);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(sync.calls, 1);
  EXPECT_EQ(both.x.scalar_type(), at::kFloat);
  EXPECT_EQ(both.w.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(both.x, r0.x, 0.05, 0.05));
  EXPECT_TRUE(at::allclose(both.w, (r0.w + r1.w) / 2, 0.05, 0.05));
  EXPECT_TRUE(at::allclose(both.b, (r0.b + r1.b) / 2, 0.05, 0.05));
}

TEST(GatheredGradTest, FrozenOrNoGradModeMakesNoCollective) {
  torch::nn::Linear layer(3, 2);
  GatheredGrad wrapped(layer);
  TwoRankSync sync({at::zeros({1, 3}), at::zeros({1, 2})});
  GradientSync::Scope scope(&sync);
  {
    at::NoGradGuard no_grad;
    wrapped->forward(at::ones({1, 3}));
  }
  for (auto& p : wrapped->parameters()) p.set_requires_grad(false);
  wrapped->forward(at::ones({1, 3}).requires_grad_(true)).sum().backward();
  EXPECT_EQ(sync.calls, 0);
}

TEST(GatheredGradTest, KeepsTheLayersNamesAndMarksItsParameters) {
  torch::nn::Sequential seq;
  seq->push_back(GatheredGrad(torch::nn::Linear(3, 2)));
  seq->push_back(torch::nn::Linear(2, 2));
  seq->to(at::kDouble);  // moves the marked tensors in place: the mark stays
  const auto named = seq->named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named.keys(), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(named["0.weight"].scalar_type(), at::kDouble);
  EXPECT_TRUE(GatheredGradImpl::averages_its_own_gradient(named["0.weight"]));
  EXPECT_TRUE(GatheredGradImpl::averages_its_own_gradient(named["0.bias"]));
  EXPECT_FALSE(GatheredGradImpl::averages_its_own_gradient(named["1.weight"]));
  std::ostringstream printed;
  seq[0]->pretty_print(printed);
  EXPECT_NE(printed.str().find("tandem::GatheredGrad(torch::nn::Linear"), std::string::npos)
      << printed.str();
}

TEST(GatheredGradTest, RefusesOverlappingPatchesAndNamesTheLayer) {
  try {
    GatheredGrad(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    FAIL() << "a 3x3 conv with padding was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Conv2d with kernel [3, 3], stride [1, 1]"), std::string::npos) << what;
    EXPECT_NE(what.find("expected a square kernel equal to its stride"), std::string::npos) << what;
  }
  EXPECT_THROW(GatheredGrad(torch::nn::ConvTranspose2d(
                   torch::nn::ConvTranspose2dOptions(3, 4, 2).stride(2).output_padding(1))),
               InvalidArgument);
}

}  // namespace
}  // namespace tandem
