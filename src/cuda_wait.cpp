// How host threads wait for the GPU (cuda_wait.h says why it matters).
#include "tandem/cuda_wait.h"

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "tandem/error.h"
#include "tandem/mode.h"  // join_choices

namespace tandem {
namespace {

struct Policy {
  CudaWait wait;
  const char* name;
  unsigned int flag;
};
constexpr Policy kPolicies[] = {
    {CudaWait::kAuto, "auto", cudaDeviceScheduleAuto},
    {CudaWait::kSpin, "spin", cudaDeviceScheduleSpin},
    {CudaWait::kYield, "yield", cudaDeviceScheduleYield},
    {CudaWait::kBlock, "block", cudaDeviceScheduleBlockingSync},
};

}  // namespace

const char* cuda_wait_name(CudaWait wait) {
  for (const Policy& p : kPolicies)
    if (p.wait == wait) return p.name;
  return "auto";
}

std::vector<std::string> cuda_wait_names() {
  std::vector<std::string> names;
  for (const Policy& p : kPolicies) names.emplace_back(p.name);
  return names;
}

CudaWait parse_cuda_wait(const std::string& name) {
  for (const Policy& p : kPolicies)
    if (name == p.name) return p.wait;
  throw InvalidArgument(detail::concat("CUDA wait '", name, "' is not valid: expected ",
                                       join_choices(cuda_wait_names())));
}

void set_cuda_wait(c10::Device device, CudaWait wait) {
  if (!device.is_cuda()) return;
  const c10::cuda::CUDAGuard guard(device);
  unsigned int flags = 0;
  TANDEM_CUDA_CHECK(cudaGetDeviceFlags(&flags));
  flags &= ~static_cast<unsigned int>(cudaDeviceScheduleMask);
  for (const Policy& p : kPolicies)
    if (p.wait == wait) flags |= p.flag;
  TANDEM_CUDA_CHECK(cudaSetDeviceFlags(flags));
}

CudaWait cuda_wait_of(c10::Device device) {
  if (!device.is_cuda()) return CudaWait::kAuto;
  const c10::cuda::CUDAGuard guard(device);
  unsigned int flags = 0;
  TANDEM_CUDA_CHECK(cudaGetDeviceFlags(&flags));
  for (const Policy& p : kPolicies)
    if (p.flag == (flags & cudaDeviceScheduleMask)) return p.wait;
  return CudaWait::kAuto;
}

}  // namespace tandem
