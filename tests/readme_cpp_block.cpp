// The README's C++ block, compiled and run as pasted (readme_cpp_block.inc is the block, cut out
// of README.md when CMake configures), with what the block calls yours: the backbone, the head and
// MyDataset. It chooses the device at run time, so on a machine without a GPU it trains on the CPU.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "tandem/optim.h"
#include "tandem/runner.h"

namespace {

namespace nn = torch::nn;

class MyDataset : public tandem::Dataset {
 public:
  int64_t size() const override { return 512; }
  std::vector<tandem::FieldSpec> fields() const override {
    return {{"image", {3, 32, 32}, at::kByte}, {"label", {}, at::kLong}};
  }
  void get(int64_t i, const std::vector<at::Tensor>& out) const override {
    out[0].random_(0, 256, at::make_generator<at::CPUGeneratorImpl>(i));
    out[1].fill_(i % 10);
  }
};

}  // namespace

int main() {
  torch::manual_seed(0);
  nn::Sequential backbone(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2)), nn::ReLU(),
                          nn::AdaptiveAvgPool2d(1), nn::Flatten());
  nn::Linear head(16, 10);
  const c10::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  backbone->to(device);
  head->to(device);
  backbone->eval();
  for (auto& p : backbone->parameters()) p.set_requires_grad(false);
  {
#include "readme_cpp_block.inc"
    std::cout << "README block: " << losses.size() << " steps, loss " << losses.front() << " -> "
              << losses.back() << "\n";
    return losses.size() == 200 && std::isfinite(losses.back()) ? 0 : 1;
  }
}
