// The reference workloads (seg, cls, mlp) through the registry and the generic runner: every
// workload in every mode computes its serial losses (CPU here; bitwise on the GPU with the label
// gpu, graphs captured), and the registry names what it knows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "tandem/error.h"
#include "tandem/runner.h"
#include "tandem/workloads/mlp.h"
#include "tandem/workloads/registry.h"
#include "test_util.h"

namespace tandem {
namespace {

std::vector<float> losses(const WorkloadEntry& e, Mode mode, c10::Device device, int64_t batch,
                          int64_t steps) {
  WorkloadOptions wo;
  wo.batch_size = batch;
  wo.seed = 11;
  wo.device = device;
  RunOptions o;
  o.mode = mode;
  o.batch_size = batch;
  o.workers = 2;
  return Runner(e.make(wo), o).train(steps);
}

void expect_every_mode_like_serial(c10::Device device, int64_t steps) {
  for (const WorkloadEntry& e : reference_workloads()) {
    if (e.name == "images") continue;  // reads files: tests/data/images_workload_test.cpp
    const int64_t batch =
        e.name == "mlp" ? (device.is_cuda() ? 64 : 4) : (device.is_cuda() ? 4 : 1);
    const auto serial = losses(e, Mode::kSerial, device, batch, steps);
    ASSERT_EQ(serial.size(), static_cast<size_t>(steps)) << e.name;
    for (float l : serial) ASSERT_TRUE(std::isfinite(l)) << e.name;
    for (const Mode mode : workload_modes()) {
      const auto got = losses(e, mode, device, batch, steps);
      ASSERT_EQ(got.size(), serial.size()) << e.name << " " << to_string(mode);
      for (size_t i = 0; i < serial.size(); ++i)
        ASSERT_EQ(got[i], serial[i]) << e.name << " " << to_string(mode) << ": step " << i;
    }
  }
}

TEST(ReferenceWorkloadsTest, EveryWorkloadInEveryModeComputesItsSerialLossesOnCpu) {
  testing::use_deterministic_algorithms();
  // With more than one intra-op thread LibTorch's CPU kernels may split a reduction differently
  // from run to run, and two serial runs of cls then differ in the last bit (seen with 2
  // threads on a 2-core machine): the modes are compared with one, as scripts/test.sh runs
  // every test (OMP_NUM_THREADS=1).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  expect_every_mode_like_serial(c10::Device(c10::kCPU), 5);
  at::set_num_threads(threads);
}

TEST(ReferenceWorkloadsTest, TheRegistryKnowsSegClsAndMlpAndNamesTheRest) {
#ifdef TANDEM_HAVE_IMAGES
  EXPECT_EQ(reference_workload_names(), (std::vector<std::string>{"seg", "cls", "mlp", "images"}));
  const char* expected = "workload 'resnet' is not known: expected seg, cls, mlp or images";
#else
  EXPECT_EQ(reference_workload_names(), (std::vector<std::string>{"seg", "cls", "mlp"}));
  const char* expected = "workload 'resnet' is not known: expected seg, cls or mlp";
#endif
  EXPECT_EQ(find_reference_workload("mlp").gpu_batch_size, 640);
  try {
    find_reference_workload("resnet");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), expected);
  }
}

TEST(ReferenceWorkloadsTest, MlpModelHasTheReferenceParameterCount) {
  auto m = make_mlp_model();
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, 4096 * 2048 + 2048 + 2048 * 1024 + 1024);
}

// Graphs captured for real: 24 steps are 3 warm-up steps, then 21 replays (graphed,
// pipelined+graphed) or 5 replays of 4 and a staged step run eagerly (graphed_k).
TEST(ReferenceWorkloadsGpuTest, EveryWorkloadInEveryModeComputesItsSerialLosses) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);  // deterministic cuBLAS (before first use)
  testing::use_deterministic_algorithms();
  expect_every_mode_like_serial(c10::Device(c10::kCUDA, 0), 24);
}

// mlp's dropout draws from the default CUDA generator inside the graphs: 150 steps cycle its 8
// resident batches many times, and a replay that drew stale masks or read stale inputs would
// change a step's loss.
TEST(ReferenceWorkloadsGpuTest, MlpReplaysMatchEagerStepsOverManyItems) {
  TANDEM_SKIP_WITHOUT_CUDA();
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  testing::use_deterministic_algorithms();
  const WorkloadEntry mlp = find_reference_workload("mlp");  // a copy: no reference into a
                                                             // temporary name (GCC 13 warns)
  const c10::Device cuda(c10::kCUDA, 0);
  const auto serial = losses(mlp, Mode::kSerial, cuda, 64, 150);
  for (const Mode mode : {Mode::kGraphed, Mode::kGraphedK, Mode::kPipelinedGraphed}) {
    const auto got = losses(mlp, mode, cuda, 64, 150);
    ASSERT_EQ(got.size(), serial.size());
    for (size_t i = 0; i < serial.size(); ++i)
      ASSERT_NEAR(got[i], serial[i], 1e-6 * std::abs(serial[i]))
          << to_string(mode) << " step " << i;
  }
}

}  // namespace
}  // namespace tandem
