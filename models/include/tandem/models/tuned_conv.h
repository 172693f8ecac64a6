// A 2-D convolution whose cuDNN plans are timed once per shape in a process — shared by all its
// threads — and kept in a file for the next process, which rebuilds them without timing.
// LibTorch's convolution with cudnn.benchmark times the same candidates but keeps its picks per
// thread and per process: every new training thread and every new process pays the tuning
// again (seconds on a ResNet's first step).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <utility>

namespace tandem::models {

/// at::conv2d(x, weight, bias, stride, padding, dilation, groups) — the same values, gradients
/// and autocast — through cuDNN's graph API with a timed plan where it applies: CUDA tensors of
/// half or bfloat16 (after autocast's cast), 4-D, grouped or not, cuDNN enabled with its benchmark
/// mode on (torch.backends.cudnn.benchmark; benchmark_limit bounds the candidates timed, as it
/// does LibTorch's), deterministic algorithms not requested, and a plan for the shape. Elsewhere
/// it is at::conv2d. A shape's first call times its candidates on the current stream (it waits
/// for the stream); under CUDA graph capture an unseen shape takes cuDNN's first choice untimed.
/// The output is channels-last where x or weight is, as LibTorch's.
at::Tensor tuned_conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                        int64_t groups);

/// The gradients of at::conv2d(x, weight, no bias, stride, padding, dilation, groups) in x and
/// weight (those `want_x` and `want_weight` ask for; the other undefined) from the output's
/// gradient dy: on the kept input- and weight-gradient plans where tuned_conv2d's apply (x and
/// weight as its backward sees them: after autocast's cast), else LibTorch's
/// convolution_backward. For an op of its own whose forward is such a convolution (e.g.
/// conv2d_with_stats) and whose backward should not time cuDNN's candidates per thread.
std::pair<at::Tensor, at::Tensor> tuned_conv2d_backward(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        at::IntArrayRef stride,
                                                        at::IntArrayRef padding,
                                                        at::IntArrayRef dilation, int64_t groups,
                                                        bool want_x, bool want_weight);

/// What the process's convolution plans cost and where they came from: timed here (and the
/// seconds that took), rebuilt from a plans file (and the seconds that took), picked untimed
/// under capture, or refused by cuDNN (those shapes run at::conv2d). One per pass and shape
/// (forward, input and weight gradient). Of all plans' seconds, `listing_seconds` went to their
/// operation graphs and cuDNN's candidate lists and `building_seconds` to the plans built (a
/// tuned shape's candidates, a rebuilt shape's one); the rest of tuning is timing them. Of
/// `listing_seconds`, `graph_seconds` went to the operation graphs alone (the rest: cuDNN's
/// candidate lists, or a kept engine configured from its knobs).
/// `runtime_compiled`: plans in use whose engine compiled its kernel in this process (NVRTC,
/// 0.3-1 s each: cuDNN's fast engines for depthwise shapes are such); `from_compiled`: of
/// `from_file`, those rebuilt from the compiled code the file kept, without compiling;
/// `configured`: of `from_file`, those whose kept engine and knobs were configured directly,
/// without cuDNN's candidate lists; `prebuilt`: of `from_file`, those prebuild_conv_plans built
/// ahead on its threads (its wall seconds in `rebuilding_seconds`); `warmup_ops` and
/// `warmup_seconds`: the ops its thread loading the step's other kernels ran beside them (0 where
/// it stopped on an error) and the seconds that took.
struct ConvPlansSummary {
  int64_t tuned = 0, from_file = 0, untimed = 0, refused = 0;
  int64_t runtime_compiled = 0, from_compiled = 0, configured = 0, prebuilt = 0, warmup_ops = 0;
  double tuning_seconds = 0.0, rebuilding_seconds = 0.0;
  double listing_seconds = 0.0, building_seconds = 0.0, graph_seconds = 0.0;
  double warmup_seconds = 0.0;
};
ConvPlansSummary conv_plans_summary();

/// Reads the plans a save_conv_plans wrote: each shape met later rebuilds its kept plan instead
/// of timing (a kept plan this cuDNN does not rebuild is timed again, with a note on stderr).
/// Returns how many it read. A missing file reads 0 with an empty `note`; a file that does not
/// parse, or was written by another cuDNN or layout, reads 0 and `note` says why — it is never
/// trusted in part. Picks timed in this process win over the file's.
int64_t load_conv_plans(const std::string& path, std::string& note);

/// Writes every plan timed or read in this process to `path` (its folders made), atomically: a
/// temporary file beside it renamed over it. False with `error` where it cannot.
bool save_conv_plans(const std::string& path, std::string& error);

/// Forgets every plan and pick: the next call of each shape times it again (or rebuilds it from
/// a file read after).
void clear_conv_plans();

/// Names the job whose convolutions run next (what decides which shapes they meet, e.g. a
/// model's convolutions' structure; empty: none). Each plan a call then uses is noted in the
/// plans file as the job's, so that a later process can build the job's plans before its first
/// step (prebuild_conv_plans).
void set_conv_plans_job(const std::string& job);

/// Builds ahead every plan the file read (load_conv_plans) notes as `job`'s, for the current
/// GPU, that this process has not built, on `threads` threads at once (each on a cuDNN handle of
/// its own), and waits for them; their shapes' first calls then run at once. Each plan whose
/// operands take at most 256 MiB is also run once on scratch memory, on the current stream, so
/// that its kernels are loaded (CUDA loads a kernel on its first launch). Returns how many it
/// built; a plan that does not come back is left to its first call, as without this. Its threads
/// build and run cuDNN plans, which load kernels and allocate: call it where no CUDA graph is
/// being captured in the process. Where TANDEM_KERNEL_WARMUP is 1, on, true or yes (off by
/// default), one more thread beside them runs a training step's other common ops (batch norm,
/// ReLU, pooling, a linear layer, cross-entropy, SGD's updates) once on tiny operands of the
/// plans' dtype and layout, on a stream of its own, so that their kernels too are loaded before
/// the step; it touches no tensor but its own and draws no random numbers.
int64_t prebuild_conv_plans(const std::string& job, int threads);

/// Whether this process holds picks, or notes of jobs, that the plans file it last saved does not.
bool conv_plans_unsaved();

/// The plans file tandem's front ends share (the CLI's runs and Python's tandem.Trainer):
/// cudnn-plans.json in $TANDEM_MODE_CACHE where it names a folder, else in
/// $XDG_CACHE_HOME/tandem/modes (~/.cache/tandem/modes without it); empty where
/// TANDEM_MODE_CACHE is 0, off, false or no (nothing kept across processes).
std::string default_conv_plans_path();

/// A process's plans kept across processes for a scope: reads the plans file as it is made
/// (load_conv_plans) and, as it ends, writes it where this process timed plans or noted jobs
/// the file does not have (save_conv_plans). A file that cannot be trusted, or cannot be
/// written, is said on stderr once, never fatal. An empty path keeps nothing.
///
///   int main() { tandem::models::KeptConvPlans plans; /* train */ }
class KeptConvPlans {
 public:
  explicit KeptConvPlans(std::string path = default_conv_plans_path());
  ~KeptConvPlans();
  KeptConvPlans(const KeptConvPlans&) = delete;
  KeptConvPlans& operator=(const KeptConvPlans&) = delete;

  /// Writes the file now where there is anything new (also done as the scope ends).
  void save();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::models
