// The profiler's host-side records summed the way the kernel table lists them: per host thread
// and call, longest total first, with each call's longest single wait.
#include "tandem/run/kernel_profile.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "tandem/detail/thread_name.h"

namespace tandem::run {
namespace {

TEST(KernelProfileTest, ApiCallsAreSummedPerThreadAndNameLongestFirst) {
  const auto calls = sum_api_calls({{"cudaLaunchKernel", 1, 0.01},
                                    {"cudaStreamSynchronize", 2, 40.0},
                                    {"cudaLaunchKernel", 1, 0.02},
                                    {"cudaStreamSynchronize", 2, 12.0},
                                    {"cudaStreamSynchronize", 1, 0.5}});
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "cudaStreamSynchronize");
  EXPECT_EQ(calls[0].thread, 2u);
  EXPECT_EQ(calls[0].count, 2);
  EXPECT_DOUBLE_EQ(calls[0].total_ms, 52.0);
  EXPECT_DOUBLE_EQ(calls[0].longest_ms, 40.0);
  EXPECT_EQ(calls[1].thread, 1u);  // the same call on another thread is a row of its own
  EXPECT_DOUBLE_EQ(calls[1].total_ms, 0.5);
  EXPECT_EQ(calls[2].name, "cudaLaunchKernel");
  EXPECT_EQ(calls[2].count, 2);
  EXPECT_NEAR(calls[2].total_ms, 0.03, 1e-12);
}

TEST(KernelProfileTest, TheTableNamesTheThreadsLongestWaits) {
  KernelProfile p;
  p.steps = 2;
  p.kernels = {{"sm90_xmma_gemm", 20, 30.0}};
  p.api_calls = sum_api_calls({{"cudaStreamSynchronize", 7, 40.0}, {"cuMemFree_v2", 7, 2.0}});
  const std::string text = describe_kernels(p);
  EXPECT_NE(text.find("CUDA API calls"), std::string::npos) << text;
  EXPECT_NE(text.find("cudaStreamSynchronize"), std::string::npos) << text;
  EXPECT_NE(text.find("20.000"), std::string::npos) << text;  // 40 ms over 2 steps
  EXPECT_NE(text.find("40.000"), std::string::npos) << text;  // the longest call
  EXPECT_LT(text.find("cudaStreamSynchronize"), text.find("cuMemFree_v2")) << text;
  const nlohmann::json j = to_json(p);
  ASSERT_EQ(j["api_calls"].size(), 2u);
  EXPECT_EQ(j["api_calls"][0]["thread"], 7);
  EXPECT_EQ(j["api_calls"][0]["longest_ms"], 40.0);
}

TEST(KernelProfileTest, ANamedThreadIsShownByItsName) {
  std::string named_as_kernel_id, named_as_pthread, named_as_low_bits;
  uint64_t augment_id = 0;
  std::thread([&] {
    name_this_thread("augment");
    augment_id = static_cast<uint64_t>(syscall(SYS_gettid));
    named_as_kernel_id = named_thread(augment_id);
    named_as_pthread = named_thread(static_cast<uint64_t>(pthread_self()));
    named_as_low_bits = named_thread(static_cast<uint64_t>(pthread_self()) & 0xffffffffu);
  }).join();
  EXPECT_EQ(named_as_kernel_id, "augment");
  EXPECT_EQ(named_as_pthread, "augment");
  EXPECT_EQ(named_as_low_bits, "augment");
  EXPECT_EQ(named_thread(0), "");
  KernelProfile p;
  p.steps = 1;
  p.api_calls =
      sum_api_calls({{"cudaStreamSynchronize", augment_id, 50.0}, {"cudaLaunchKernel", 0, 0.1}});
  const std::string text = describe_kernels(p);
  EXPECT_NE(text.find("augment  cudaStreamSynchronize"), std::string::npos) << text;
  EXPECT_NE(text.find(" 0  cudaLaunchKernel"), std::string::npos) << text;  // unnamed: its id
  EXPECT_EQ(to_json(p)["api_calls"][0]["thread_name"], "augment");
}

TEST(KernelProfileTest, NoApiCallsLeaveTheTableAsItWas) {
  KernelProfile p;
  p.steps = 1;
  p.kernels = {{"k", 1, 1.0}};
  EXPECT_EQ(describe_kernels(p).find("CUDA API calls"), std::string::npos);
}

}  // namespace
}  // namespace tandem::run
