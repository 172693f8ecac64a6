// batch_norm_relu: relu(batch_norm(x) + residual) as one op gives LibTorch's BatchNorm2d + add +
// ReLU: outputs, gradients of x, weight, bias and the residual, running statistics and the
// batch count — in float64 on the CPU (the formulas of its backward), and on the GPU through
// LibTorch's CUDA batch-norm kernels and tandem's fused apply kernel (float32 and bf16, NCHW
// and channels-last, vector and scalar paths); a ResNet-18 training step fused against unfused.
#include "tandem/models/batch_norm_relu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "resnet_step.h"
#include "tandem/detail/autocast.h"
#include "tandem/error.h"
#include "tandem/models/resnet.h"
#include "test_util.h"

namespace tandem::models {
namespace {

using test_steps::max_relative;

struct Case {
  int64_t n, c, h, w;
  bool residual, channels_last;
  bool relu = true;     // false: batch_norm_train
  double offset = 0.5;  // the input's mean
};

// One forward and backward of both versions on `device` in `dtype` (the reference in float64
// on the CPU); the largest relative difference of every output, gradient and statistic.
double compare_with_module(const Case& k, c10::Device device, at::ScalarType dtype) {
  torch::manual_seed(11);
  const auto fmt = k.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x0 = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble) * 2 + k.offset;
  const at::Tensor r0 = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble);
  const at::Tensor dy = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble);
  torch::nn::BatchNorm2d ours(k.c), ref(k.c);
  {
    torch::NoGradGuard no_grad;
    ours->weight.uniform_(0.5, 1.5);
    ours->bias.normal_(0, 0.3);
    ours->running_mean.normal_(0, 0.1);
    ours->running_var.uniform_(0.5, 1.5);
  }
  ref->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    auto to_params = ref->named_parameters();
    for (const auto& p : ours->named_parameters()) to_params[p.key()].copy_(p.value());
    auto to_buffers = ref->named_buffers();
    for (const auto& b : ours->named_buffers()) to_buffers[b.key()].copy_(b.value());
  }
  // Parameters and statistics stay float32 beside low-precision activations, as under autocast.
  ours->to(device, dtype == at::kDouble ? at::kDouble : at::kFloat);

  const at::Tensor x = x0.to(device, dtype).contiguous(fmt).requires_grad_();
  const at::Tensor r = r0.to(device, dtype).contiguous(fmt).requires_grad_();
  const at::Tensor g = dy.to(device, dtype).contiguous(fmt);
  at::Tensor y = k.relu ? batch_norm_relu(x, *ours, k.residual ? r : at::Tensor())
                        : batch_norm_train(x, *ours);
  y.backward(g);

  // The reference sees the same (rounded) inputs, in float64.
  const at::Tensor xr = x.detach().to(c10::kCPU, at::kDouble).contiguous().requires_grad_();
  const at::Tensor rr = r.detach().to(c10::kCPU, at::kDouble).contiguous().requires_grad_();
  at::Tensor yr = ref->forward(xr);
  if (k.relu && k.residual) yr = yr + rr;
  if (k.relu) yr = yr.relu();
  yr.backward(g.to(c10::kCPU, at::kDouble).contiguous());

  double worst = 0;
  auto check = [&](const char* what, const at::Tensor& a, const at::Tensor& b) {
    const double d = max_relative(a, b);
    if (d > worst) std::cerr << "  " << what << " differs by " << d << " (relative)\n";
    worst = std::max(worst, d);
  };
  check("y", y, yr);
  check("dx", x.grad(), xr.grad());
  check("dweight", ours->weight.grad(), ref->weight.grad());
  check("dbias", ours->bias.grad(), ref->bias.grad());
  if (k.relu && k.residual) check("dresidual", r.grad(), rr.grad());
  check("running_mean", ours->running_mean, ref->running_mean);
  check("running_var", ours->running_var, ref->running_var);
  EXPECT_EQ(ours->num_batches_tracked.item<int64_t>(), 1);
  // (A 1x1 map is both layouts at once; LibTorch calls it contiguous.)
  if (k.h * k.w > 1) {
    EXPECT_EQ(y.suggest_memory_format(), fmt);
  }
  return worst;
}

TEST(BatchNormReluTest, MatchesBatchNormAddReluInDoubleOnTheCpu) {
  for (const Case& k :
       {Case{3, 5, 4, 6, false, false}, Case{3, 5, 4, 6, true, false}, Case{2, 8, 5, 3, true, true},
        Case{4, 16, 2, 2, false, true}, Case{3, 5, 4, 6, false, true, false}}) {
    SCOPED_TRACE(std::to_string(k.c) + (k.residual ? " residual" : "") +
                 (k.channels_last ? " channels_last" : ""));
    EXPECT_LT(compare_with_module(k, c10::Device(c10::kCPU), at::kDouble), 1e-10);
  }
}

TEST(BatchNormReluTest, RejectsWhatItCannotRun) {
  torch::nn::BatchNorm2d bn(4);
  EXPECT_THROW(batch_norm_relu(torch::randn({2, 3, 4, 4}), *bn), InvalidArgument);
  EXPECT_THROW(batch_norm_train(torch::randn({2, 3, 4, 4}), *bn), InvalidArgument);
  EXPECT_THROW(batch_norm_relu(torch::randn({2, 4, 4}), *bn), InvalidArgument);
  EXPECT_THROW(batch_norm_relu(torch::randn({1, 4, 1, 1}), *bn), InvalidArgument);
  EXPECT_THROW(batch_norm_relu(torch::randn({2, 4, 3, 3}), *bn, torch::randn({2, 4, 3, 2})),
               InvalidArgument);
  torch::nn::BatchNorm2d plain(torch::nn::BatchNorm2dOptions(4).affine(false));
  EXPECT_THROW(batch_norm_relu(torch::randn({2, 4, 3, 3}), *plain), InvalidArgument);
}

// batch_norm_relu_twice: the same values twice, one storage, and a backward that takes the two
// uses' gradients apart and gives what batch_norm_relu's gives for their sum — the same bits, as
// the sum is rounded once either way (the channels-last kernels sum them in their first pass;
// other paths add them first). One use without a gradient is the single op's backward.
void expect_twice_matches_the_sum(c10::Device device, at::ScalarType dtype, bool channels_last) {
  SCOPED_TRACE(std::string(c10::toString(dtype)) + (channels_last ? " channels_last" : ""));
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  torch::manual_seed(15);
  const at::TensorOptions o = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x0 = (torch::randn({4, 16, 5, 6}, o) * 2 + 0.5).contiguous(fmt);
  const at::Tensor r0 = torch::randn({4, 16, 5, 6}, o).contiguous(fmt);
  const at::Tensor g1 = torch::randn({4, 16, 5, 6}, o).contiguous(fmt);
  const at::Tensor g2 = torch::randn({4, 16, 5, 6}, o).contiguous(fmt);
  // x_grad false: only the residual's gradient wanted of the activations (the kernels then
  // write no dL/dx; with two gradients the residual's is their masked sum as the sums' pass
  // wrote it).
  auto run = [&](bool twice, bool second_used, bool x_grad) {
    torch::nn::BatchNorm2d bn(16);
    bn->to(device, dtype == at::kDouble ? at::kDouble : at::kFloat);
    const at::Tensor x = x0.clone().requires_grad_(x_grad);
    const at::Tensor r = r0.clone().requires_grad_();
    if (twice) {
      auto [a, b] = batch_norm_relu_twice(x, *bn, r);
      EXPECT_TRUE(at::equal(a, b));
      EXPECT_EQ(a.data_ptr(), b.data_ptr());  // one storage
      if (second_used)
        torch::autograd::backward({a, b}, {g1, g2});
      else
        a.backward(g1);
    } else {
      batch_norm_relu(x, *bn, r).backward(second_used ? g1 + g2 : g1);
    }
    return std::vector<at::Tensor>{x_grad ? x.grad() : at::zeros({1}),
                                   r.grad(),
                                   bn->weight.grad(),
                                   bn->bias.grad(),
                                   bn->running_mean.clone(),
                                   bn->running_var.clone()};
  };
  for (const bool x_grad : {true, false}) {
    for (const bool second_used : {true, false}) {
      const auto twice = run(true, second_used, x_grad), once = run(false, second_used, x_grad);
      for (size_t i = 0; i < twice.size(); ++i)
        EXPECT_TRUE(at::equal(twice[i], once[i]))
            << "output " << i << (second_used ? "" : ", one use") << (x_grad ? "" : ", no dL/dx");
    }
  }
}

TEST(BatchNormReluTest, TheTwiceFormsBackwardIsTheSingleOnesOnTheSumInDoubleOnTheCpu) {
  expect_twice_matches_the_sum(c10::Device(c10::kCPU), at::kDouble, false);
  expect_twice_matches_the_sum(c10::Device(c10::kCPU), at::kDouble, true);
}

TEST(BatchNormReluGpuTest, TheTwiceFormsBackwardIsTheSingleOnesOnTheSumBitForBit) {
  TANDEM_SKIP_WITHOUT_CUDA();
  for (const at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
    expect_twice_matches_the_sum(c10::Device(c10::kCUDA, 0), t, true);   // the kernels' sum
    expect_twice_matches_the_sum(c10::Device(c10::kCUDA, 0), t, false);  // NCHW: added first
  }
}

// Eval mode's running statistics applied as one pass: bn(x) (+ residual) (ReLU) in eval mode
// and without gradients, against BatchNorm2d's eval forward, add and ReLU in float64; on the GPU
// the apply kernel (float32 tight, bf16 within its one rounding), both layouts.
double compare_eval_with_module(const Case& k, c10::Device device, at::ScalarType dtype) {
  torch::manual_seed(13);
  const auto fmt = k.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  torch::nn::BatchNorm2d bn(k.c);
  {
    torch::NoGradGuard no_grad;
    bn->weight.uniform_(0.5, 1.5);
    bn->bias.normal_(0, 0.3);
    bn->running_mean.normal_(k.offset, 0.5);
    bn->running_var.uniform_(0.5, 4.0);
  }
  bn->eval();
  const at::Tensor x0 = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble) * 2 + k.offset;
  const at::Tensor r0 = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble);
  const at::Tensor x = x0.to(device, dtype).contiguous(fmt);
  const at::Tensor r = r0.to(device, dtype).contiguous(fmt);
  torch::NoGradGuard no_grad;
  // The reference: BatchNorm2d's eval forward in float64 on the same (rounded) inputs.
  bn->to(at::kDouble);
  at::Tensor ref = bn->forward(x.to(c10::kCPU, at::kDouble).contiguous());
  if (k.residual) ref = ref + r.to(c10::kCPU, at::kDouble);
  if (k.relu) ref = ref.relu();
  // Parameters and statistics float32 beside low-precision activations, as under autocast.
  bn->to(device, dtype == at::kDouble ? at::kDouble : at::kFloat);
  const at::Tensor y = batch_norm_relu_eval(x, *bn, k.residual ? r : at::Tensor(), k.relu);
  EXPECT_EQ(y.scalar_type(), dtype);
  EXPECT_TRUE(y.is_contiguous(fmt));
  return max_relative(y, ref);
}

TEST(BatchNormReluTest, TheEvalFormMatchesBatchNormAddReluInDoubleOnTheCpu) {
  for (const Case& k : {Case{3, 5, 4, 6, false, false}, Case{3, 5, 4, 6, true, false},
                        Case{2, 8, 5, 3, true, true}, Case{3, 5, 4, 6, false, true, false}}) {
    SCOPED_TRACE(std::to_string(k.c) + (k.residual ? " residual" : "") +
                 (k.relu ? "" : " no relu"));
    EXPECT_LT(compare_eval_with_module(k, c10::Device(c10::kCPU), at::kDouble), 1e-12);
  }
}

TEST(BatchNormReluTest, TheEvalFormRefusesAnInputThatWantsAGradient) {
  torch::nn::BatchNorm2d bn(4);
  const at::Tensor x = torch::randn({2, 4, 3, 3}).requires_grad_();
  EXPECT_THROW(batch_norm_relu_eval(x, *bn), InvalidArgument);
  EXPECT_THROW(batch_norm_relu_eval(torch::randn({2, 3, 3, 3}), *bn), InvalidArgument);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(batch_norm_relu_eval(x, *bn).sizes(), x.sizes());
}

TEST(BatchNormReluGpuTest, TheEvalFormMatchesTheModuleInFloatAndBf16BothLayouts) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  for (const Case& k : {Case{8, 64, 7, 9, true, true}, Case{8, 64, 8, 8, false, false},
                        Case{4, 6, 3, 5, true, true}, Case{32, 256, 7, 7, false, true, false}}) {
    SCOPED_TRACE(std::to_string(k.c) + (k.residual ? " residual" : "") +
                 (k.channels_last ? " channels_last" : ""));
    EXPECT_LT(compare_eval_with_module(k, cuda, at::kFloat), 1e-5);
    EXPECT_LT(compare_eval_with_module(k, cuda, at::kBFloat16), 1e-2);
  }
}

// CUDA, float32 (tight) and bf16 (one rounding of the output against the float64 reference):
// channels-last with whole vectors per row on tandem's statistics, mask and backward kernels
// (many rows: many splits to combine; a mean far from zero against a small spread; no ReLU; a
// channel count whole in float32's 4-wide vectors but not bf16's 8-wide ones), the other layouts
// on LibTorch's batch-norm kernels and the fused apply (C = 6 and H*W = 15: its one-element path).
TEST(BatchNormReluGpuTest, MatchesTheModuleInFloatAndBf16BothLayouts) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  for (const Case& k :
       {Case{8, 64, 7, 9, true, true}, Case{8, 64, 8, 8, false, false},
        Case{4, 6, 3, 5, true, true}, Case{4, 6, 3, 5, true, false},
        Case{64, 64, 28, 28, true, true}, Case{32, 256, 7, 7, false, true},
        Case{16, 128, 14, 14, false, true, false}, Case{16, 64, 9, 9, true, true, true, 40.0},
        Case{8, 12, 5, 5, true, true}, Case{4, 2048, 1, 1, true, true}}) {
    SCOPED_TRACE(std::to_string(k.c) + (k.residual ? " residual" : "") +
                 (k.channels_last ? " channels_last" : ""));
    EXPECT_LT(compare_with_module(k, cuda, at::kFloat), 1e-4);
    EXPECT_LT(compare_with_module(k, cuda, at::kBFloat16), 2e-2);
  }
}

// tandem's channels-last kernels combine their partial sums in a fixed order: the same input
// gives the same bits, output and gradients, on every run.
TEST(BatchNormReluGpuTest, RepeatsBitForBit) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(13);
  const at::Tensor x0 =
      torch::randn({32, 128, 28, 28}, torch::TensorOptions(cuda).dtype(at::kBFloat16))
          .contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor dy = torch::randn_like(x0);
  std::vector<at::Tensor> first;
  for (int run = 0; run < 2; ++run) {
    torch::nn::BatchNorm2d bn(128);
    bn->to(cuda);
    const at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor y = batch_norm_relu(x, *bn, x0);
    y.backward(dy);
    const std::vector<at::Tensor> now{
        y, x.grad(), bn->weight.grad(), bn->bias.grad(), bn->running_mean, bn->running_var};
    if (run == 0)
      first = now;
    else
      for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(at::equal(now[i], first[i])) << i;
  }
}

// A ResNet-18 training step, channels-last, the fused batch norms against LibTorch's modules
// from the same weights. In float32 the step's every gradient and running statistic match
// closely (only summation orders differ). In bf16 autocast the loss and the statistics match
// within bf16's rounding; the gradients are not compared there: the fused op rounds its output
// once where the unfused ops round twice, and in the last layers (a few values per channel) the
// batch norm's backward cancels most of the gradient, so one rounding step moves what is left by
// tens of percent in either version (a layer-4 weight gradient differed by 0.65 of its largest
// value in a try).
test_steps::ResNetStep resnet_step(bool fused, bool bf16) {
  ResNetOptions options;
  options.num_classes = 10;
  options.fused_batch_norm = fused;
  return test_steps::resnet_step(resnet18, options, bf16 ? Precision::kBf16 : Precision::kFp32);
}

TEST(BatchNormReluGpuTest, AResNetStepMatchesTheUnfusedOne) {
  TANDEM_SKIP_WITHOUT_CUDA();
  at::globalContext().setAllowTF32CuDNN(false);  // float32 convolutions, not TF32
  const test_steps::ResNetStep f = resnet_step(true, false), u = resnet_step(false, false);
  at::globalContext().setAllowTF32CuDNN(true);
  EXPECT_LT(max_relative(f.loss, u.loss), 1e-5);
  ASSERT_EQ(f.grads.size(), u.grads.size());
  for (size_t i = 0; i < f.grads.size(); ++i)
    EXPECT_LT(max_relative(f.grads[i].second, u.grads[i].second), 1e-3)
        << "float32 gradient of " << f.grads[i].first;
  for (size_t i = 0; i < f.buffers.size(); ++i)
    EXPECT_LT(max_relative(f.buffers[i].second, u.buffers[i].second), 1e-5)
        << "float32 " << f.buffers[i].first;

  const test_steps::ResNetStep fb = resnet_step(true, true), ub = resnet_step(false, true);
  EXPECT_LT(max_relative(fb.loss, ub.loss), 2e-2);
  for (size_t i = 0; i < fb.buffers.size(); ++i)
    EXPECT_LT(max_relative(fb.buffers[i].second, ub.buffers[i].second), 2e-2)
        << "bf16 " << fb.buffers[i].first;
}

// An evaluation's forward (eval mode, no gradients) of a trained ResNet-18 on the fused kernels
// against LibTorch's modules from the same weights and running statistics: float32 logits
// within summation order, bf16 within its rounding; with gradients on, eval mode runs the
// modules (a frozen batch norm under fine-tuning) and its gradients reach the input.
TEST(BatchNormReluGpuTest, AResNetEvaluationMatchesTheUnfusedOne) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  auto logits = [&](bool fused, bool bf16) {
    torch::manual_seed(14);
    ResNet net = resnet18(ResNetOptions{10, fused});
    const at::Tensor x = torch::randn({16, 3, 64, 64}).to(cuda);
    net->to(cuda);
    to_channels_last(*net);
    {
      torch::NoGradGuard no_grad;
      for (auto& b : net->named_buffers())
        if (b.key().find("running_var") != std::string::npos)
          b.value().uniform_(0.5, 2.0);
        else if (b.key().find("running_mean") != std::string::npos)
          b.value().normal_(0, 0.2);
    }
    net->eval();
    torch::NoGradGuard no_grad;
    AutocastScope autocast(cuda, bf16 ? Precision::kBf16 : Precision::kFp32);
    return net->forward(x.contiguous(at::MemoryFormat::ChannelsLast)).to(at::kFloat);
  };
  at::globalContext().setAllowTF32CuDNN(false);
  const double f32 = max_relative(logits(true, false), logits(false, false));
  at::globalContext().setAllowTF32CuDNN(true);
  EXPECT_LT(f32, 1e-4);
  EXPECT_LT(max_relative(logits(true, true), logits(false, true)), 5e-2);

  ResNet net = resnet18(ResNetOptions{10, true});
  net->to(cuda);
  net->eval();
  const at::Tensor x = torch::randn({2, 3, 32, 32}, cuda).requires_grad_();
  net->forward(x).sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
}  // namespace tandem::models
