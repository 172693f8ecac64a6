// data_parallel: a workload of your own trained on several processes (tandem::distributed). Started
// plainly, it launches itself as --nproc ranks (distributed::run_local_ranks, torchrun's
// environment contract); under torchrun it is one of them. Each rank builds the same workload,
// joins the group, and make_data_parallel broadcasts rank 0's weights and averages the gradients
// during backward; each rank reads its shard of the dataset. The first layer is a
// tandem::GatheredGrad: its gradient is formed from every rank's inputs and output gradients,
// gathered, instead of all-reduced (worth it where the weight is much larger than batch x (in +
// out): seg's 4096-channel layers, not this small one, which is here to show it). At the end the
// ranks compare their weights: they must be bitwise identical.
//
//   data_parallel [--nproc N] [--device cpu|cuda] [--steps S]
//   torchrun --nproc-per-node 2 data_parallel --device cuda
#include "tandem/distributed/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/nn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/distributed/launch_env.h"
#include "tandem/distributed/launcher.h"
#include "tandem/gathered_grad.h"
#include "tandem/runner.h"

// Sample i: 16 features and the regression target 3 * sum(features) / 16 (a pure function of i).
class LineDataset : public tandem::Dataset {
 public:
  int64_t size() const override { return 4096; }
  std::vector<tandem::FieldSpec> fields() const override {
    return {{"x", {16}, at::kFloat}, {"y", {1}, at::kFloat}};
  }
  void get(int64_t i, const std::vector<at::Tensor>& out) const override {
    for (int64_t k = 0; k < 16; ++k)
      out[0][k] = static_cast<float>(((i * 31 + k * 17) % 97) / 97.0);
    out[1].fill_(out[0].sum() * (3.0 / 16));
  }
};

int main(int argc, char** argv) {
  int nproc = 2, steps = 32;
  std::string device_flag = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--nproc")) nproc = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--device")) device_flag = argv[i + 1];
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  const auto env = tandem::distributed::launch_env_from_environment();
  if (!env)  // not launched yet: become the launcher of nproc copies of this program
    return tandem::distributed::run_local_ranks(nproc, std::vector<std::string>(argv, argv + argc));

  const c10::Device device =
      device_flag == "cuda" ? c10::Device(c10::kCUDA, env->local_rank) : c10::Device(c10::kCPU);
  auto group = tandem::distributed::ProcessGroup::connect(*env, device);

  torch::manual_seed(1);  // the same model on every rank (rank 0's is broadcast anyway)
  torch::nn::Sequential model(tandem::GatheredGrad(torch::nn::Linear(16, 32)), torch::nn::ReLU(),
                              torch::nn::Linear(32, 1));
  model->to(device);
  tandem::Workload w;
  w.name = "line";
  w.device = device;
  w.data = tandem::DataSource::from_dataset(std::make_shared<LineDataset>(), /*shuffle=*/true);
  w.train.inputs = {"x", "y"};
  w.train.loss = [model](const tandem::Tensors& in) mutable {
    return at::mse_loss(model->forward(in[0]), in[1]);
  };
  w.train.optimizer = std::make_shared<tandem::optim::Sgd>(model->parameters(), 0.05);
  tandem::distributed::make_data_parallel(w, group);

  tandem::RunOptions o;
  o.mode = device.is_cuda() ? tandem::Mode::kPipelinedGraphed : tandem::Mode::kPipelined;
  o.batch_size = 32;  // per rank
  o.workers = 1;
  o.rank = group->rank();
  o.world_size = group->world_size();
  const std::vector<float> losses = tandem::Runner(w, o).train(steps);

  // Losses averaged over the ranks; the weights' checksum compared: max == min on every rank.
  const double first = group->all_reduce_host({losses.front()})[0];
  const double last = group->all_reduce_host({losses.back()})[0];
  double sum = 0;
  for (const auto& p : model->parameters()) sum += p.detach().to(at::kDouble).sum().item<double>();
  const double hi =
      group->all_reduce_host({sum}, tandem::distributed::ProcessGroup::HostOp::kMax)[0];
  const double lo =
      -group->all_reduce_host({-sum}, tandem::distributed::ProcessGroup::HostOp::kMax)[0];
  group->finish();
  if (group->rank() == 0) {
    std::printf("%d ranks (%s), %d steps of batch %lld per rank: loss %.5f -> %.5f\n",
                group->world_size(), group->backend().c_str(), steps,
                static_cast<long long>(o.batch_size), first, last);
    std::printf("note: %s\n", w.train.gradient_sync->what().c_str());
    std::printf("weights on every rank %s\n", hi == lo ? "identical" : "DIFFER");
  }
  return hi == lo && last < first ? 0 : 1;
}
