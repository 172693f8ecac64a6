// Device collectives over the rendezvous store (collectives.h): the CPU's data parallel, where
// the wheel ships no gloo headers. Each round moves every rank's whole payload through the
// store, so it is for tests and small CPU models; NCCL carries the GPU's.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>

#include "collectives.h"
#include "tandem/error.h"

namespace tandem::distributed {

namespace {

std::vector<uint8_t> to_bytes(const at::Tensor& host) {
  std::vector<uint8_t> out(host.numel() * host.element_size());
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

// The tensors' bytes one after another (host, contiguous tensors).
std::vector<uint8_t> to_bytes(const std::vector<at::Tensor>& host) {
  std::vector<uint8_t> out;
  for (const auto& h : host) {
    const auto b = to_bytes(h);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

class StoreCollectives : public DeviceCollectives {
 public:
  explicit StoreCollectives(std::shared_ptr<StoreExchange> exchange)
      : exchange_(std::move(exchange)) {}

  // Every rank's values travel as float32 (float64 for double tensors), are summed in float64
  // in rank order, so every rank computes the same bits, then divided.
  void all_reduce_mean_(const std::vector<at::Tensor>& tensors) override {
    const bool wide = std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
      return t.scalar_type() == at::kDouble;
    });
    const at::ScalarType wire = wide ? at::kDouble : at::kFloat;
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors)  // floating point: checked by ProcessGroup
      flat.push_back(t.detach().to(at::kCPU, wire).reshape({-1}));
    const at::Tensor mine = at::cat(flat);
    const auto all = exchange_->exchange(to_bytes(mine));
    at::Tensor sum = at::zeros({mine.numel()}, at::kDouble);
    const size_t expected = static_cast<size_t>(mine.numel()) * mine.element_size();
    for (const auto& b : all) {
      TORCH_CHECK(b.size() == expected, "all_reduce_mean_: a rank sent ", b.size(),
                  " bytes, this rank ", expected, ": expected the same tensors on every rank");
      sum.add_(at::from_blob(const_cast<uint8_t*>(b.data()), {mine.numel()}, wire));
    }
    sum.div_(static_cast<double>(exchange_->world()));
    int64_t offset = 0;
    for (const auto& t : tensors) {
      at::Tensor target = t.detach();
      target.copy_(sum.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }

  void broadcast_(const std::vector<at::Tensor>& tensors, int root) override {
    std::vector<at::Tensor> host;
    for (const auto& t : tensors) host.push_back(t.detach().to(at::kCPU).contiguous());
    const std::vector<uint8_t> mine =
        exchange_->rank() == root ? to_bytes(host) : std::vector<uint8_t>();
    const std::vector<uint8_t> got = exchange_->broadcast(mine, root);
    if (exchange_->rank() == root) return;
    size_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t n = host[i].numel() * host[i].element_size();
      TORCH_CHECK(offset + n <= got.size(), "broadcast_: rank ", root, " sent ", got.size(),
                  " bytes: expected the same tensors on every rank");
      if (n) std::memcpy(host[i].data_ptr(), got.data() + offset, n);
      offset += n;
      at::Tensor target = tensors[i].detach();
      target.copy_(host[i]);
    }
  }

  // Each rank's bytes, as they are: the gathered rows are the very bits every rank sent.
  void all_gather_(const std::vector<at::Tensor>& inputs,
                   const std::vector<at::Tensor>& outputs) override {
    std::vector<at::Tensor> host;
    for (const auto& t : inputs) host.push_back(t.detach().to(at::kCPU).contiguous());
    const std::vector<uint8_t> mine = to_bytes(host);
    const auto all = exchange_->exchange(mine);
    for (size_t r = 0; r < all.size(); ++r) {
      TORCH_CHECK(all[r].size() == mine.size(), "all_gather_: rank ", r, " sent ", all[r].size(),
                  " bytes, this rank ", mine.size(), ": expected the same tensors on every rank");
      size_t offset = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        const int64_t rows = inputs[i].size(0);
        at::Tensor part = at::empty_like(host[i]);
        const size_t n = part.numel() * part.element_size();
        if (n) std::memcpy(part.data_ptr(), all[r].data() + offset, n);
        offset += n;
        outputs[i].narrow(0, static_cast<int64_t>(r) * rows, rows).copy_(part);
      }
    }
  }

  std::string name() const override { return "store (CPU)"; }

 private:
  std::shared_ptr<StoreExchange> exchange_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_store_collectives(std::shared_ptr<StoreExchange> exchange) {
  return std::make_unique<StoreCollectives>(std::move(exchange));
}

}  // namespace tandem::distributed
