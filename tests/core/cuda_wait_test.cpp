// How host threads wait for the GPU: every policy's name reads back as itself and a bad one is
// named with the valid ones; a CPU device takes no setting; on a GPU the policy set is the one
// the device reports, and it changes what a wait costs the waiting thread — spinning holds its
// core for the whole wait, blocking leaves it.
#include "tandem/cuda_wait.h"

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <chrono>

#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"
#include "test_util.h"

namespace tandem {
namespace cuda_wait_test {

TEST(CudaWaitTest, EveryPolicysNameReadsBackAndABadOneIsNamed) {
  for (const CudaWait w : {CudaWait::kAuto, CudaWait::kSpin, CudaWait::kYield, CudaWait::kBlock})
    EXPECT_EQ(parse_cuda_wait(cuda_wait_name(w)), w) << cuda_wait_name(w);
  EXPECT_STREQ(cuda_wait_name(CudaWait::kBlock), "block");
  try {
    parse_cuda_wait("nap");
    FAIL() << "'nap' was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "CUDA wait 'nap' is not valid: expected auto, spin, yield or block");
  }
  EXPECT_THROW(parse_cuda_wait("Block"), InvalidArgument);
}

TEST(CudaWaitTest, ACpuDeviceTakesNoSetting) {
  const c10::Device cpu(c10::kCPU);
  EXPECT_NO_THROW(set_cuda_wait(cpu, CudaWait::kBlock));
  EXPECT_EQ(cuda_wait_of(cpu), CudaWait::kAuto);
}

// The share of a core the calling thread used while it waited for a kernel of ~100 ms.
double core_share_of_a_wait() {
  at::cuda::sleep(200'000'000);  // cycles: ~100 ms at a data-centre GPU's ~2 GHz
  const auto start = std::chrono::steady_clock::now();
  const ThreadUsage before = this_thread_usage();
  c10::cuda::device_synchronize();
  const double cpu = (this_thread_usage() - before).cpu_seconds;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return wall > 0 ? cpu / wall : 0;
}

TEST(CudaWaitGpuTest, ThePolicySetIsTheDevicesAndDecidesWhatAWaitCostsItsThread) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  c10::cuda::device_synchronize();  // the context exists: the setting applies to one in use
  const CudaWait before = cuda_wait_of(cuda);
  set_cuda_wait(cuda, CudaWait::kSpin);
  EXPECT_EQ(cuda_wait_of(cuda), CudaWait::kSpin);
  core_share_of_a_wait();  // the sleep kernel's first launch loads it: not a wait of its own
  const double spinning = core_share_of_a_wait();
  set_cuda_wait(cuda, CudaWait::kBlock);
  EXPECT_EQ(cuda_wait_of(cuda), CudaWait::kBlock);
  const double blocked = core_share_of_a_wait();
  set_cuda_wait(cuda, before);
  EXPECT_EQ(cuda_wait_of(cuda), before);
  // A spinner runs on its core for the whole wait, a blocked thread sleeps through it.
  EXPECT_GT(spinning, 0.5) << "spinning: " << spinning << " of a core";
  EXPECT_LT(blocked, 0.5) << "blocked: " << blocked << " of a core";
}

}  // namespace cuda_wait_test
}  // namespace tandem
