// Lanes and the device choice: parse_device accepts what the CLI documents and names a bad
// value; a CPU lane is the calling thread (its waits are no-ops); a CUDA lane is a stream of its
// own whose waits order work without a host sync. Asking for CUDA's most hardware queues keeps a
// value the user set, and the variable is read as CUDA reads it.
#include "tandem/detail/lane.h"

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tandem/error.h"
#include "tandem/hardware_queues.h"
#include "test_support.h"
#include "test_util.h"

namespace tandem {
namespace {

using test_support::kCpu;

// The message of the InvalidArgument that parse_device(text) throws; "" if it throws none.
std::string parse_error(const std::string& text) {
  try {
    parse_device(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(LaneTest, ParseDeviceAcceptsAutoCpuAndCuda) {
  EXPECT_EQ(parse_device("cpu"), kCpu);
  EXPECT_EQ(parse_device("auto"), default_device());
  if (testing::have_cuda()) {
    EXPECT_EQ(parse_device("auto"), c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(parse_device("cuda"), c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(parse_device("cuda:0"), c10::Device(c10::kCUDA, 0));
  } else {
    EXPECT_EQ(parse_device("auto"), kCpu);
    // Well formed, but there is no device to run on: said so, with the count.
    for (const std::string text : {"cuda", "cuda:0"})
      EXPECT_EQ(parse_error(text),
                "device '" + text + "' is not available: this machine has 0 CUDA device(s)");
  }
}

TEST(LaneTest, ParseDeviceNamesABadValueAndWhatWasExpected) {
  for (const std::string text : {"tpu", "cuda:x", "cuda:", "cuda0", "cuda:-1", "CPU", "", " cpu"})
    EXPECT_EQ(parse_error(text),
              "device '" + text + "' is not valid: expected auto, cpu, cuda or cuda:N")
        << text;
  // An index beyond any machine's devices (and beyond an int) is unavailable, not a crash.
  for (const std::string text : {"cuda:4096", "cuda:99999999999999999999"})
    EXPECT_NE(parse_error(text).find("device '" + text + "' is not available"), std::string::npos)
        << text;
}

TEST(LaneTest, ACpuLaneIsTheCallingThread) {
  const Lane a = Lane::create("load", kCpu, LanePriority::kHigh);
  const Lane b = Lane::create("train", kCpu);
  const Lane current = Lane::current("caller", kCpu);
  EXPECT_EQ(a.name(), "load");
  EXPECT_EQ(a.device(), kCpu);
  for (const Lane* lane : {&a, &b, &current}) EXPECT_FALSE(lane->is_cuda()) << lane->name();
  // Waits and synchronization are no-ops: the work ran inside the call that enqueued it.
  a.wait_for(b);
  b.wait_for(a);
  a.synchronize();
  EXPECT_TRUE(a.same_stream(b));  // both "the calling thread"
  EXPECT_THROW(a.stream(), c10::Error);
  {
    LaneGuard guard(a, "work");  // only an NVTX range: ops still run on the CPU
    EXPECT_TRUE(at::ones({2}).add(1).equal(at::full({2}, 2.0)));
  }
}

TEST(HardwareQueuesTest, AskingSetsCudasMostOnlyWhereTheEnvironmentNamedNone) {
  const char* before = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string kept = before ? before : "";
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  EXPECT_TRUE(ask_for_hardware_queues());
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "32");
  EXPECT_EQ(hardware_queues(), kHardwareQueues);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "4", 1);
  EXPECT_FALSE(ask_for_hardware_queues()) << "a value the user set is kept";
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "4");
  if (before)
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", kept.c_str(), 1);
  else
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

TEST(HardwareQueuesTest, ReadsTheVariableAsCudaDoes) {
  const char* before = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string kept = before ? before : "";
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "16", 1);
  EXPECT_EQ(hardware_queues(), 16);
  for (const char* bad : {"", "many", "0", "-4", "12x"}) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", bad, 1);
    EXPECT_EQ(hardware_queues(), 8) << "'" << bad << "'";
  }
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  EXPECT_EQ(hardware_queues(), 8);
  if (before) setenv("CUDA_DEVICE_MAX_CONNECTIONS", kept.c_str(), 1);
}

TEST(LaneGpuTest, LanesCreatedTogetherHaveStreamsOfTheirOwn) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const Lane a = Lane::create("a", cuda), b = Lane::create("b", cuda);
  const Lane high = Lane::create("high", cuda, LanePriority::kHigh);
  EXPECT_TRUE(a.is_cuda());
  EXPECT_FALSE(a.same_stream(b));
  EXPECT_NE(a.stream(), c10::cuda::getDefaultCUDAStream(0));
  EXPECT_LT(high.stream().priority(), a.stream().priority());  // lower number: higher priority
  {
    LaneGuard guard(b);
    EXPECT_EQ(c10::cuda::getCurrentCUDAStream(0), b.stream());
  }
  EXPECT_NE(c10::cuda::getCurrentCUDAStream(0), b.stream());  // restored
  EXPECT_TRUE(Lane::current("caller", cuda).same_stream(Lane::current("again", cuda)));
}

// b.wait_for(a) orders b's later work after a's earlier work on the device: b reads what a
// writes after a long kernel, without the host waiting for it.
TEST(LaneGpuTest, WaitForOrdersWorkAcrossLanesWithoutAHostSync) {
  TANDEM_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  const Lane a = Lane::create("producer", cuda), b = Lane::create("consumer", cuda);
  at::Tensor value = at::zeros({1024}, at::TensorOptions().device(cuda));
  c10::cuda::device_synchronize();  // the zeros ran on the default stream
  at::Tensor copy;
  {
    LaneGuard guard(a);
    at::cuda::sleep(50'000'000);  // tens of milliseconds: long enough to race without the wait
    value.fill_(3.0);
  }
  b.wait_for(a);
  {
    LaneGuard guard(b);
    copy = value.clone();
  }
  b.synchronize();
  EXPECT_TRUE(copy.equal(at::full({1024}, 3.0, at::TensorOptions().device(cuda))));
  a.synchronize();
}

}  // namespace
}  // namespace tandem
