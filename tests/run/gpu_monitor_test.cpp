// GPU utilization through NVML: absent NVML or no GPU gives "n/a", never a crash.
#include "tandem/run/gpu_monitor.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "test_util.h"

namespace tandem::run {
namespace {

TEST(GpuMonitorTest, CpuDeviceHasNoUtilization) {
  GpuMonitor m(c10::Device(c10::kCPU));
  EXPECT_FALSE(m.available());
  m.start();
  m.stop();
  EXPECT_FALSE(m.mean_utilization().has_value());
  EXPECT_EQ(format_utilization(m.mean_utilization()), "n/a");
}

TEST(GpuMonitorTest, MissingNvmlLibraryIsReportedNotFatal) {
  GpuMonitor m(c10::Device(c10::kCUDA, 0), "libnvidia-ml-does-not-exist.so.1");
  EXPECT_FALSE(m.available());
  EXPECT_NE(m.unavailable_reason().find("NVML not found"), std::string::npos);
  m.start();
  m.stop();
  EXPECT_EQ(format_utilization(m.mean_utilization()), "n/a");
}

TEST(GpuMonitorTest, FormatsAPercentage) { EXPECT_EQ(format_utilization(87.54), "87.5%"); }

TEST(GpuMonitorGpuTest, AShortRunGetsOneReading) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GpuMonitor m(c10::Device(c10::kCUDA, 0), "libnvidia-ml.so.1", /*period_ms=*/1000);
  if (!m.available()) GTEST_SKIP() << "NVML unavailable: " << m.unavailable_reason();
  m.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // shorter than any sample period
  m.stop();
  ASSERT_TRUE(m.mean_utilization().has_value());
  EXPECT_GE(m.samples(), 1);
  EXPECT_GE(*m.mean_utilization(), 0.0);
  EXPECT_LE(*m.mean_utilization(), 100.0);
}

// Kernels back to back for 2 s: every sample the driver took in that time saw a busy GPU.
TEST(GpuMonitorGpuTest, ABusyGpuReadsMostlyBusy) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GpuMonitor m(c10::Device(c10::kCUDA, 0), "libnvidia-ml.so.1", /*period_ms=*/300);
  if (!m.available()) GTEST_SKIP() << "NVML unavailable: " << m.unavailable_reason();
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(at::kCUDA));
  at::Tensor b = at::mm(a, a);
  c10::cuda::device_synchronize();
  m.start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 20; ++i) b = at::mm(a, a);  // ~ms each: the queue never runs dry
    c10::cuda::device_synchronize();
  }
  m.stop();
  ASSERT_TRUE(m.mean_utilization().has_value());
  std::printf("busy GPU: %.1f%% over %lld %s\n", *m.mean_utilization(),
              static_cast<long long>(m.samples()),
              m.from_driver_buffer() ? "driver samples" : "readings");
  EXPECT_GE(m.samples(), 2) << "a 2 s run spans several of the driver's sample periods";
  EXPECT_GE(*m.mean_utilization(), 80.0);
}

}  // namespace
}  // namespace tandem::run
