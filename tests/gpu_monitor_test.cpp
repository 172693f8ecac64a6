// GPU utilization through NVML: absent NVML or no GPU gives "n/a", never a crash.
#include <gtest/gtest.h>

#include <thread>

#include "tandem/gpu_monitor.h"
#include "test_util.h"

namespace tandem {
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

TEST(GpuMonitorGpuTest, SamplesUtilizationWhereNvmlExists) {
  TANDEM_SKIP_WITHOUT_CUDA();
  GpuMonitor m(c10::Device(c10::kCUDA, 0));
  if (!m.available()) GTEST_SKIP() << "NVML unavailable: " << m.unavailable_reason();
  m.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  m.stop();
  ASSERT_TRUE(m.mean_utilization().has_value());
  EXPECT_GE(*m.mean_utilization(), 0.0);
  EXPECT_LE(*m.mean_utilization(), 100.0);
}

}  // namespace
}  // namespace tandem
