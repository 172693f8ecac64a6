// Data parallel across processes, on the CPU (the store collectives): this test binary re-runs
// itself as the ranks of a job (DataParallelWorker.*, which run only when TANDEM_DIST_TEST_DIR
// is set), each rank writes its final weights, and the parent compares them — with each other
// (bitwise) and with one process trained on the global batch (within 1e-6), with the first
// layer's gradient all-reduced or formed from the gathered batch (GatheredGrad). Also: a rank
// killed mid-run ends every other rank within 30 s with a line naming it, and bad environments.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/nn.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/distributed/data_parallel.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/distributed/process_group.h"
#include "tandem/gathered_grad.h"
#include "tandem/runner.h"

namespace tandem {
namespace {

constexpr int64_t kSamples = 96, kIn = 6, kHidden = 16, kOut = 3, kBatchPerRank = 4;

// y = f(x) for a fixed random table: a pure function of the index (Dataset's contract).
class TableDataset : public Dataset {
 public:
  TableDataset() {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
    x_ = at::randn({kSamples, kIn}, g);
    y_ = at::randn({kSamples, kOut}, g);
  }
  int64_t size() const override { return kSamples; }
  std::vector<FieldSpec> fields() const override {
    return {{"x", {kIn}, at::kFloat}, {"y", {kOut}, at::kFloat}};
  }
  void get(int64_t i, const std::vector<at::Tensor>& out) const override {
    out[0].copy_(x_[i]);
    out[1].copy_(y_[i]);
  }

 private:
  at::Tensor x_, y_;
};

// The test's model, from one seed; `gathered`: its first layer a GatheredGrad (the same
// parameters, the same forward).
torch::nn::Sequential make_model(bool gathered) {
  torch::manual_seed(3);
  torch::nn::Linear first(kIn, kHidden);
  torch::nn::Sequential model;
  if (gathered)
    model->push_back(GatheredGrad(first));
  else
    model->push_back(first);
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(kHidden, kOut));
  return model;
}

// Trains one epoch of the table in `mode` at `batch` per process and returns the weights.
// With a group: as its rank, data parallel. The model is built from one seed on every rank.
std::vector<at::Tensor> train_epoch(Mode mode, int64_t batch,
                                    const std::shared_ptr<distributed::ProcessGroup>& group,
                                    c10::Device device = c10::Device(c10::kCPU),
                                    bool gathered = false) {
  torch::nn::Sequential model = make_model(gathered);
  model->to(device);
  Workload w;
  w.name = "table";
  w.device = device;
  w.data = DataSource::from_dataset(std::make_shared<TableDataset>(), /*shuffle=*/true);
  w.train.inputs = {"x", "y"};
  w.train.loss = [model](const Tensors& in) mutable {
    return at::mse_loss(model->forward(in[0]), in[1]);
  };
  optim::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  w.train.optimizer = std::make_shared<optim::Sgd>(model->parameters(), so);
  RunOptions ro;
  ro.mode = mode;
  ro.batch_size = batch;
  ro.workers = 2;
  ro.seed = 11;
  if (group) {
    // Rank 0's weights are broadcast: make the others start elsewhere, so the test sees it.
    if (group->rank() != 0) {
      at::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(1.0);
    }
    distributed::make_data_parallel(w, group);
    // The first layer's two parameters left the buckets: its backward must gather, or the
    // ranks' weights part.
    if (gathered) {
      EXPECT_NE(w.train.gradient_sync->what().find("2 parameters (0.000448 MB) from every rank's "
                                                   "gathered batch"),
                std::string::npos)
          << w.train.gradient_sync->what();
    }
    ro.rank = group->rank();
    ro.world_size = group->world_size();
  }
  Runner runner(w, ro);
  const int64_t steps = w.data.batches_per_epoch(batch, ro.world_size);
  runner.train(steps);
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().to(at::kCPU).clone());
  return out;
}

std::string dir_of_test() {
  const char* d = std::getenv("TANDEM_DIST_TEST_DIR");
  return d ? d : "";
}

void save(const std::vector<at::Tensor>& ts, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& t : ts) {
    const at::Tensor c = t.contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
}

std::vector<at::Tensor> load_like(const std::vector<at::Tensor>& like, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "no weights at " << path;
  std::vector<at::Tensor> out;
  for (const auto& t : like) {
    at::Tensor c = at::empty_like(t).contiguous();
    in.read(static_cast<char*>(c.data_ptr()), c.numel() * c.element_size());
    out.push_back(c);
  }
  return out;
}

// ---- the ranks (run by the parent below; skipped in a plain test run)

TEST(DataParallelWorker, TrainsOneEpoch) {
  if (dir_of_test().empty()) GTEST_SKIP() << "a rank of DataParallelTest, not a test by itself";
  const auto env = distributed::launch_env_from_environment();
  ASSERT_TRUE(env.has_value());
  const char* dev = std::getenv("TANDEM_DIST_TEST_DEVICE");
  const c10::Device device =
      dev && std::string(dev) == "cuda"
          ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank))
          : c10::Device(c10::kCPU);
  auto group = distributed::ProcessGroup::connect(*env, device);
  const Mode mode = parse_mode(std::getenv("TANDEM_DIST_TEST_MODE"));
  const char* gathered = std::getenv("TANDEM_DIST_TEST_GATHERED");
  const auto weights = train_epoch(mode, kBatchPerRank, group, device,
                                   gathered != nullptr && std::string(gathered) == "1");
  save(weights, dir_of_test() + "/rank" + std::to_string(env->rank) + ".bin");
  group->finish();
}

TEST(DataParallelWorker, TrainsUntilKilled) {
  if (dir_of_test().empty()) GTEST_SKIP() << "a rank of DataParallelTest, not a test by itself";
  const auto env = distributed::launch_env_from_environment();
  ASSERT_TRUE(env.has_value());
  auto group = distributed::ProcessGroup::connect(*env, c10::Device(c10::kCPU));
  std::ofstream(dir_of_test() + "/started" + std::to_string(env->rank)).put('1');
  for (int i = 0; i < 100000; ++i) train_epoch(Mode::kSerial, kBatchPerRank, group);
  group->finish();
}

// ---- the parent

struct Rank {
  pid_t pid;
  std::string log;
};

// Starts this binary as `world` ranks running `filter`, each with its own log file; `extra`
// environment entries per rank override the defaults.
std::vector<Rank> start_ranks(int world, const std::string& filter, const std::string& dir,
                              const std::string& mode, int port,
                              const std::vector<std::vector<std::string>>& extra = {}) {
  std::vector<Rank> ranks;
  for (int r = 0; r < world; ++r) {
    const std::string log = dir + "/rank" + std::to_string(r) + ".log";
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("TANDEM_DIST_TEST_DIR", dir.c_str(), 1);
      setenv("TANDEM_DIST_TEST_MODE", mode.c_str(), 1);
      if (r < static_cast<int>(extra.size()))
        for (const auto& kv : extra[r]) {
          const auto eq = kv.find('=');
          setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
        }
      const std::string f = "--gtest_filter=" + filter;
      execl("/proc/self/exe", "dist_test", f.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back({pid, log});
  }
  return ranks;
}

// Waits for `pid` up to `timeout`; returns its exit code (128 + signal), or -1 on timeout.
int wait_for(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string temp_dir() {
  char tmpl[] = "/tmp/tandem-dist-XXXXXX";
  return mkdtemp(tmpl);
}

// A port no other test of this run uses: the tests of this binary may run in parallel (ctest).
int test_port(int offset) { return 29000 + (getpid() % 400) * 5 + offset; }

// Parameters by value (std::string, not const char*): ctest's test names print them, and a
// pointer would print as an address.
class DataParallelTest
    : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(DataParallelTest, RanksAgreeAndMatchOneProcessOnTheGlobalBatch) {
  const auto [world, mode, first_layer] = GetParam();
  const bool gathered = first_layer == "gathered";
  const std::string dir = temp_dir();
  const std::vector<std::string> env = {std::string("TANDEM_DIST_TEST_GATHERED=") +
                                        (gathered ? "1" : "0")};
  auto ranks = start_ranks(world, "DataParallelWorker.TrainsOneEpoch", dir, mode,
                           test_port(world + (gathered ? 10 : 0) + (mode == "serial" ? 0 : 20)),
                           std::vector<std::vector<std::string>>(world, env));
  for (auto& r : ranks)
    ASSERT_EQ(wait_for(r.pid, std::chrono::seconds(300)), 0) << read_file(r.log);
  const auto single = train_epoch(parse_mode(mode), kBatchPerRank * world, nullptr);
  const auto rank0 = load_like(single, dir + "/rank0.bin");
  for (int r = 1; r < world; ++r) {
    const auto other = load_like(single, dir + "/rank" + std::to_string(r) + ".bin");
    for (size_t i = 0; i < single.size(); ++i)
      EXPECT_TRUE(at::equal(rank0[i], other[i])) << "rank " << r << " parameter " << i;
  }
  for (size_t i = 0; i < single.size(); ++i) {
    const double diff = (rank0[i] - single[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << "parameter " << i << ": data parallel vs one process";
  }
  // The runs did train: the weights moved from their initial values.
  const auto initial_params = make_model(false)->parameters();
  for (size_t i = 0; i < single.size(); ++i)
    EXPECT_GT((single[i] - initial_params[i]).abs().max().item<double>(), 1e-3)
        << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndModes, DataParallelTest,
    ::testing::Values(std::make_tuple(2, std::string("serial"), std::string("all_reduced")),
                      std::make_tuple(3, std::string("serial"), std::string("all_reduced")),
                      std::make_tuple(2, std::string("pipelined"), std::string("all_reduced")),
                      std::make_tuple(2, std::string("serial"), std::string("gathered")),
                      std::make_tuple(3, std::string("pipelined"), std::string("gathered")),
                      // 4 and 8 ranks, on the CPU: the shard of
                      // every rank, the store's collectives and the
                      // gathered batch.
                      std::make_tuple(4, std::string("serial"), std::string("all_reduced")),
                      std::make_tuple(8, std::string("pipelined"), std::string("all_reduced")),
                      std::make_tuple(8, std::string("pipelined"), std::string("gathered"))));

// Two GPUs over NCCL, the all-reduce eager (serial) and captured in the train step's graph
// (pipelined+graphed): the ranks agree bitwise and match one GPU on the global batch.
class DataParallelGpuTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
};

TEST_P(DataParallelGpuTest, RanksAgreeAndMatchOneGpuOnTheGlobalBatch) {
  if (c10::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto [mode, first_layer] = GetParam();
  const bool gathered = first_layer == "gathered";
  const std::string dir = temp_dir();
  const std::vector<std::string> env = {
      "TANDEM_DIST_TEST_DEVICE=cuda",
      std::string("TANDEM_DIST_TEST_GATHERED=") + (gathered ? "1" : "0")};
  auto ranks = start_ranks(2, "DataParallelWorker.TrainsOneEpoch", dir, mode,
                           test_port(40 + (gathered ? 1 : 0)), {env, env});
  for (auto& r : ranks)
    ASSERT_EQ(wait_for(r.pid, std::chrono::seconds(300)), 0) << read_file(r.log);
  const auto single =
      train_epoch(parse_mode(mode), kBatchPerRank * 2, nullptr, c10::Device(c10::kCUDA, 0));
  const auto rank0 = load_like(single, dir + "/rank0.bin");
  const auto rank1 = load_like(single, dir + "/rank1.bin");
  for (size_t i = 0; i < single.size(); ++i) {
    EXPECT_TRUE(at::equal(rank0[i], rank1[i])) << "parameter " << i;
    EXPECT_LE((rank0[i] - single[i]).abs().max().item<double>(), 1e-5) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, DataParallelGpuTest,
    ::testing::Combine(::testing::Values(std::string("serial"), std::string("pipelined"),
                                         std::string("pipelined+graphed")),
                       ::testing::Values(std::string("all_reduced"), std::string("gathered"))));

TEST(DataParallelFailureTest, AKilledRankStopsTheOthersWithinThirtySeconds) {
  for (int victim : {1, 0}) {  // a plain rank, then the one hosting the store
    const std::string dir = temp_dir();
    auto ranks = start_ranks(2, "DataParallelWorker.TrainsUntilKilled", dir, "serial",
                             test_port(10 + victim));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < until &&
           !(std::ifstream(dir + "/started0").good() && std::ifstream(dir + "/started1").good()))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mid-run
    kill(ranks[victim].pid, SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    EXPECT_EQ(wait_for(ranks[victim].pid, std::chrono::seconds(10)), 128 + SIGKILL);
    const int survivor = 1 - victim;
    const int code = wait_for(ranks[survivor].pid, std::chrono::seconds(30));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    const std::string log = read_file(ranks[survivor].log);
    EXPECT_NE(code, -1) << "rank " << survivor << " still ran 30 s after rank " << victim
                        << " was killed:\n"
                        << log;
    EXPECT_NE(code, 0) << log;
    EXPECT_LT(took, 30.0);
    if (victim == 1)
      EXPECT_NE(log.find("rank 1 of 2 stopped responding"), std::string::npos) << log;
    else
      EXPECT_NE(log.find("lost the rendezvous store"), std::string::npos) << log;
  }
}

TEST(DataParallelFailureTest, RanksOfDifferentWorldSizesFailAtOnce) {
  const std::string dir = temp_dir();
  // Rank 0 thinks the world is 2, rank 1 thinks it is 3.
  auto ranks = start_ranks(2, "DataParallelWorker.TrainsOneEpoch", dir, "serial", test_port(20),
                           {{}, {"WORLD_SIZE=3"}});
  for (auto& r : ranks) {
    const int code = wait_for(r.pid, std::chrono::seconds(60));
    EXPECT_NE(code, 0);
    EXPECT_NE(code, -1) << "a rank hung";
  }
  EXPECT_NE(read_file(ranks[0].log).find("rank 1 was started with WORLD_SIZE=3"), std::string::npos)
      << read_file(ranks[0].log);
}

// ---- the environment contract, in this process

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static void set(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  static std::string error_of() {
    try {
      distributed::launch_env_from_environment();
    } catch (const distributed::EnvironmentError& e) {
      return e.what();
    }
    return "";
  }
  static constexpr const char* kVars[] = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "TORCHELASTIC_USE_AGENT_STORE"};
};

TEST_F(LaunchEnvTest, NoneSetIsOneProcess) {
  EXPECT_FALSE(distributed::launch_env_from_environment());
}

TEST_F(LaunchEnvTest, ReadsTorchrunsContract) {
  set({{"RANK", "3"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "10.0.0.1"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const auto e = distributed::launch_env_from_environment();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_TRUE(e->agent_store);
}

TEST_F(LaunchEnvTest, NamesWhatIsWrong) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  EXPECT_NE(error_of().find("MASTER_ADDR is not set"), std::string::npos) << error_of();
  set({{"MASTER_ADDR", "127.0.0.1"}, {"RANK", "2"}});
  EXPECT_NE(error_of().find("RANK=2 is not valid for WORLD_SIZE=2"), std::string::npos)
      << error_of();
  set({{"RANK", "1"}, {"WORLD_SIZE", "two"}});
  EXPECT_NE(error_of().find("WORLD_SIZE='two' is not valid"), std::string::npos) << error_of();
  set({{"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  EXPECT_NE(error_of().find("MASTER_PORT=70000 is not valid"), std::string::npos) << error_of();
  set({{"MASTER_PORT", "29500"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}});
  EXPECT_NE(error_of().find("LOCAL_RANK=2 is not valid"), std::string::npos) << error_of();
}

// The job's timeouts from the environment, for any launcher: each variable sets its own, unset
// ones keep the defaults, and a value that is not a positive number of seconds is named.
TEST(ProcessGroupTest, TheEnvironmentSetsTheTimeouts) {
  const char* vars[] = {"TANDEM_JOIN_TIMEOUT", "TANDEM_HEARTBEAT_TIMEOUT",
                        "TANDEM_COLLECTIVE_TIMEOUT"};
  for (const char* v : vars) unsetenv(v);
  const distributed::ProcessGroupOptions defaults;
  distributed::ProcessGroupOptions o = distributed::options_from_environment();
  EXPECT_EQ(o.join_timeout, defaults.join_timeout);
  EXPECT_EQ(o.dead_after_s, defaults.dead_after_s);
  setenv("TANDEM_JOIN_TIMEOUT", "300", 1);
  setenv("TANDEM_HEARTBEAT_TIMEOUT", "2.5", 1);
  setenv("TANDEM_COLLECTIVE_TIMEOUT", "60", 1);
  o = distributed::options_from_environment();
  EXPECT_EQ(o.join_timeout, std::chrono::seconds(300));
  EXPECT_EQ(o.dead_after_s, 2.5);
  EXPECT_EQ(o.collective_timeout, std::chrono::seconds(60));
  for (const char* bad : {"0", "-3", "soon", "1e9"}) {
    setenv("TANDEM_HEARTBEAT_TIMEOUT", bad, 1);
    try {
      distributed::options_from_environment();
      ADD_FAILURE() << bad << " was taken";
    } catch (const distributed::EnvironmentError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TANDEM_HEARTBEAT_TIMEOUT='") + bad +
                                           "' is not valid: expected a number of seconds > 0"),
                std::string::npos)
          << e.what();
    }
  }
  for (const char* v : vars) unsetenv(v);
}

TEST(ProcessGroupTest, APortInUseIsAnEnvironmentError) {
  // A listener on the port first (a store server: any program bound to it would do).
  distributed::LaunchEnv env;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = test_port(30);
  distributed::ProcessGroupOptions o;
  o.join_timeout = std::chrono::seconds(2);
  std::thread first([&] {
    try {
      distributed::ProcessGroup::connect(env, c10::Device(c10::kCPU), o);
    } catch (const std::exception&) {  // times out waiting for rank 1: expected
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  try {
    distributed::ProcessGroup::connect(env, c10::Device(c10::kCPU), o);
    ADD_FAILURE() << "a second rank 0 on the same port connected";
  } catch (const distributed::EnvironmentError& e) {
    EXPECT_NE(std::string(e.what()).find("is MASTER_PORT in use?"), std::string::npos) << e.what();
  }
  first.join();
}

}  // namespace
}  // namespace tandem
