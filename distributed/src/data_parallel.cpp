// GradientBuckets and make_data_parallel (data_parallel.h).
#include "tandem/distributed/data_parallel.h"

#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <optional>

#include "tandem/gathered_grad.h"

namespace tandem::distributed {

namespace {

// The hook a parameter carries: tells its GradientBuckets that the gradient has been
// accumulated. A raw pointer: ~GradientBuckets removes the hooks before it goes.
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradientBuckets* buckets, size_t index) : owner(buckets), param(index) {}
  void operator()(const torch::autograd::Variable&) override { owner->on_gradient_ready(param); }
  GradientBuckets* owner;
  size_t param;
};

}  // namespace

struct GradientBuckets::Impl {
  std::vector<at::Tensor> params;
  int64_t own_params = 0, own_bytes = 0;  // GatheredGrad's: averaged by their layer
  std::vector<at::Tensor> marked;         // GatheredGrad's, all-reduced (gathered_grad off)
  std::shared_ptr<ProcessGroup> group;
  DataParallelOptions options;
  struct Bucket {
    std::vector<size_t> params;
    int64_t bytes = 0;
    size_t pending = 0;  // gradients not yet ready this step
    bool launched = false;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  size_t next = 0;                // the next bucket to launch: strictly in order
  std::mutex mu;
  bool cuda = false;
  std::optional<c10::cuda::CUDAStream> comm;  // the comm lane (CUDA)
  at::cuda::CUDAEvent ready, done, gathered;

  void reset() {
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.launched = false;
    }
    next = 0;
  }

  // All-reduces bucket b's gradients: on the comm lane after the work that produced them (CUDA),
  // or at once (CPU, where the store collectives are synchronous).
  void launch(size_t b) {
    Bucket& bucket = buckets[b];
    std::vector<at::Tensor> grads;
    for (size_t i : bucket.params) {
      at::Tensor& g = params[i].mutable_grad();
      if (!g.defined()) g = at::zeros_like(params[i]);  // unused this step: every rank sends it
      grads.push_back(g);
    }
    if (cuda) {
      const c10::DeviceIndex index = params[bucket.params[0]].device().index();
      ready.record(c10::cuda::getCurrentCUDAStream(index));
      ready.block(*comm);
      c10::cuda::CUDAStreamGuard guard(*comm);
      group->all_reduce_mean_(grads);
    } else {
      group->all_reduce_mean_(grads);
    }
    bucket.launched = true;
  }

  void launch_ready() {
    while (next < buckets.size() && buckets[next].pending == 0) launch(next++);
  }
};

GradientBuckets::GradientBuckets(std::vector<at::Tensor> params,
                                 std::shared_ptr<ProcessGroup> group, DataParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  TANDEM_CHECK_ARG(group != nullptr, "data parallel needs a process group: got none");
  TANDEM_CHECK_ARG(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0, "bucket caps ",
                   options.first_bucket_cap_mb, " / ", options.bucket_cap_mb,
                   " MB are not valid: expected > 0");
  im.group = std::move(group);
  im.options = options;
  std::optional<c10::Device> device;  // the first trained parameter's
  for (auto& p : params) {
    if (!p.defined() || !p.requires_grad()) continue;
    if (!device) device = p.device();
    if (GatheredGradImpl::averages_its_own_gradient(p)) {
      if (options.gathered_grad) {  // its layer averages it
        ++im.own_params;
        im.own_bytes += p.numel() * static_cast<int64_t>(p.element_size());
        continue;
      }
      im.marked.push_back(p);  // all-reduced here after all; the mark is restored in the end
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    }
    im.params.push_back(p);
  }
  TANDEM_CHECK_ARG(device.has_value(),
                   "data parallel: the train stage has no parameter that requires grad");
  im.cuda = device->is_cuda();
  for (const auto& p : im.params) {
    TANDEM_CHECK_ARG(p.device() == im.params[0].device(), "data parallel: parameters on ",
                     im.params[0].device(), " and ", p.device(),
                     ": expected every trained parameter on this rank's device");
    TANDEM_CHECK_ARG(!torch::autograd::impl::post_acc_grad_hooks(p),
                     "data parallel: a parameter of shape ", p.sizes(),
                     " already has a post-accumulate-grad hook: expected none");
  }
  // Reverse order, the order backward produces the gradients; a new bucket at the cap or at a
  // change of dtype (one group of collectives per bucket, one dtype per bucket).
  im.bucket_of.resize(im.params.size());
  for (size_t k = im.params.size(); k-- > 0;) {
    const at::Tensor& p = im.params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool fresh = im.buckets.empty();
    if (!fresh) {
      const Impl::Bucket& last = im.buckets.back();
      const double cap_mb =
          im.buckets.size() == 1 ? options.first_bucket_cap_mb : options.bucket_cap_mb;
      fresh = last.bytes + bytes > static_cast<int64_t>(cap_mb * 1e6) ||
              im.params[last.params.front()].scalar_type() != p.scalar_type();
    }
    if (fresh) im.buckets.emplace_back();
    im.buckets.back().params.push_back(k);
    im.buckets.back().bytes += bytes;
    im.bucket_of[k] = im.buckets.size() - 1;
  }
  if (im.cuda) im.comm = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device->index());
  for (size_t i = 0; i < im.params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(im.params[i],
                                                   std::make_unique<ReadyHook>(this, i));
  im.reset();
}

GradientBuckets::~GradientBuckets() {
  for (auto& p : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  for (auto& p : impl_->marked) GatheredGradImpl::mark_averaged_by_its_layer(p);
}

size_t GradientBuckets::num_buckets() const { return impl_->buckets.size(); }

void GradientBuckets::before_backward() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reset();
}

void GradientBuckets::on_gradient_ready(size_t param) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  Impl::Bucket& b = im.buckets[im.bucket_of[param]];
  if (b.launched || b.pending == 0) return;  // a second backward in one step: not ours to sync
  --b.pending;
  im.launch_ready();
}

void GradientBuckets::after_backward() {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  // Buckets with a gradient that never came (a parameter unused this step) go now, in order.
  while (im.next < im.buckets.size()) im.launch(im.next++);
  if (im.cuda) {
    const c10::DeviceIndex index = im.comm->device_index();
    im.done.record(*im.comm);
    im.done.block(c10::cuda::getCurrentCUDAStream(index));
  }
}

std::string GradientBuckets::what() const {
  const Impl& im = *impl_;
  int64_t bytes = 0;
  for (const auto& b : im.buckets) bytes += b.bytes;
  std::string own;
  if (im.own_params > 0)
    own = detail::concat("; ", im.own_params, " parameters (", im.own_bytes / 1e6,
                         " MB) from every rank's gathered batch (GatheredGrad)");
  return detail::concat("data parallel: gradients averaged over ", im.group->world_size(),
                        " ranks (", im.group->backend(), ") during backward, ", im.params.size(),
                        " parameters (", bytes / 1e6, " MB) in ", im.buckets.size(),
                        " buckets of <= ", im.options.bucket_cap_mb, " MB", own,
                        im.cuda ? ", on a comm lane" : "");
}

int GradientBuckets::world_size() const { return impl_->group->world_size(); }

bool GradientBuckets::gathers_layer_batches() const { return impl_->options.gathered_grad; }

std::vector<at::Tensor> GradientBuckets::all_gather_batch(const std::vector<at::Tensor>& local) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  std::vector<at::Tensor> inputs, outputs;
  for (const auto& t : local) {
    TANDEM_CHECK_ARG(t.defined() && t.dim() >= 1, "all_gather_batch: expected batch-first ",
                     "tensors, got ", t.defined() ? "a scalar" : "an undefined tensor");
    inputs.push_back(t.contiguous());
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] *= im.group->world_size();
    // Allocated on the current stream, which waits for the gather below before it uses them.
    outputs.push_back(at::empty(shape, t.options()));
  }
  if (!im.cuda) {
    im.group->all_gather_(inputs, outputs);
    return outputs;
  }
  // On the comm lane, after the buckets launched so far: one order of collectives on every rank.
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(im.comm->device_index());
  im.ready.record(current);
  im.ready.block(*im.comm);
  {
    c10::cuda::CUDAStreamGuard guard(*im.comm);
    im.group->all_gather_(inputs, outputs);
  }
  im.gathered.record(*im.comm);
  im.gathered.block(current);
  return outputs;
}

void make_data_parallel(Workload& workload, std::shared_ptr<ProcessGroup> group,
                        DataParallelOptions options) {
  TANDEM_CHECK_ARG(group != nullptr, "make_data_parallel: no process group");
  TANDEM_CHECK_ARG(workload.train.optimizer != nullptr,
                   "make_data_parallel: the train stage of workload '", workload.name,
                   "' has no optimizer");
  if (group->world_size() == 1) return;
  std::vector<at::Tensor> params = workload.train.optimizer->parameters();
  {
    // Rank 0's initial weights everywhere, as DistributedDataParallel's constructor does.
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> data;
    for (auto& p : params) data.push_back(p.detach());
    group->broadcast_(data, 0);
    if (workload.device.is_cuda())
      c10::cuda::getCurrentCUDAStream(workload.device.index()).synchronize();
  }
  workload.train.gradient_sync =
      std::make_shared<GradientBuckets>(std::move(params), std::move(group), options);
}

}  // namespace tandem::distributed
