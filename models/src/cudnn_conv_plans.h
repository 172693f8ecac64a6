// A convolution's three passes (forward, input gradient, weight gradient) as cuDNN graphs whose
// plan is chosen once per shape by timing cuDNN's candidates, shared by every thread of the
// process and kept across processes as (engine, knobs) choices in a file. The only file that
// includes the frontend for this is cudnn_conv_plans.cpp; tuned_conv.cpp is the autograd op.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

#include "tandem/models/tuned_conv.h"

namespace tandem::models::detail {

enum class ConvPass { kForward, kInputGrad, kWeightGrad };

struct ConvGeometry {
  at::IntArrayRef stride, padding, dilation;
};

/// Runs one pass into `out` (allocated by the caller: the pass's output sizes and strides):
/// kForward out = conv(a = x, b = w); kInputGrad out = dx from (a = dy, b = w); kWeightGrad
/// out = dw from (a = dy, b = x). All CUDA, one dtype (half or bfloat16), 16-byte aligned;
/// grouped where x's channels are a multiple of the weight's (cuDNN reads the count off them). The
/// shape's plan is timed on first use (the current stream synchronized) unless a choice for it was
/// loaded, or the stream is capturing (then cuDNN's heuristic choice, not kept). Returns false,
/// writing nothing, where cuDNN has no plan for the shape (`why` says why the first time; empty
/// after).
bool cudnn_conv_pass(ConvPass pass, const at::Tensor& a, const at::Tensor& b, at::Tensor& out,
                     const ConvGeometry& geometry, std::string& why);

/// What the process's plans cost and came from.
ConvPlansSummary plan_counts();

/// The plans file (tuned_conv.h's load_conv_plans / save_conv_plans / clear_conv_plans).
int64_t load_plan_choices(const std::string& path, std::string& note);
bool save_plan_choices(const std::string& path, std::string& error);
void clear_plans();
/// tuned_conv.h's set_conv_plans_job, conv_plans_unsaved and prebuild_conv_plans.
void set_plans_job(const std::string& job);
bool plans_unsaved();
/// `warm_kernels`: a thread beside the plans' runs warm_step_kernels (kernel_warmup.h).
int64_t prebuild_plans(const std::string& job, int threads, bool warm_kernels);

}  // namespace tandem::models::detail
