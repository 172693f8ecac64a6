// Workload "mlp": the model, its device-resident batches and its train stage as a Workload.
#include "tandem/workloads/mlp.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <memory>

#include "tandem/error.h"
#include "tandem/optim.h"

namespace tandem {

namespace nn = torch::nn;

torch::nn::Sequential make_mlp_model() {
  return nn::Sequential(nn::Linear(kMlpIn, kMlpHidden), nn::Dropout(0.2),
                        nn::Linear(kMlpHidden, kMlpOut), nn::Dropout(0.1));
}

MlpWorkload make_mlp(const WorkloadOptions& options) {
  check_params("mlp", options.params, {});
  TANDEM_CHECK_ARG(options.batch_size > 0, "batch size ", options.batch_size,
                   " is not valid: expected a positive number of rows");
  torch::manual_seed(options.seed);
  MlpWorkload m;
  m.model = make_mlp_model();
  m.model->to(options.device);
  m.model->train();
  Workload& w = m.workload;
  w.name = "mlp";
  w.device = options.device;
  // Rank 0 draws what one process draws; another rank, its own data (the model is the same).
  if (options.rank != 0) torch::manual_seed(options.data_seed());
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device);
  std::vector<Batch> batches(kMlpDistinctBatches);  // GPU-resident data, as the reference's
  for (auto& b : batches) {
    b.set("x", at::randn({options.batch_size, kMlpIn}, f32));
    b.set("y", at::randn({options.batch_size, kMlpOut}, f32));
  }
  w.data = DataSource::resident(std::move(batches));
  auto model = m.model.ptr();  // shared_ptr: forward() from a const lambda
  w.train.inputs = {"x", "y"};
  w.train.loss = [model](const Tensors& in) { return at::mse_loss(model->forward(in[0]), in[1]); };
  w.train.optimizer = std::make_shared<optim::Sgd>(m.model->parameters(), kMlpLearningRate);
  w.train.what = "forward with dropout, MSE";
  return m;
}

WorkloadEntry mlp_entry() {
  // the reference workload's (640, 4096) input on a GPU
  return {"mlp",
          "4096-2048-1024 MLP with dropout on device-resident batches "
          "(docs/reference-workloads.md)",
          640,
          16,
          {},
          [](const WorkloadOptions& o) { return make_mlp(o).workload; }};
}

}  // namespace tandem
