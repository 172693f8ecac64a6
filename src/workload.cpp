// The workload description: data sources, validation of a workload's field flow, and the
// workload-specific parameters a factory accepts.
#include "tandem/workload.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <algorithm>
#include <set>

#include "tandem/error.h"
#include "tandem/mode.h"
#include "tandem/sampler.h"

namespace tandem {

at::Generator seeded_generator(c10::Device device, uint64_t seed) {
  at::Generator generator = device.is_cuda() ? at::cuda::detail::createCUDAGenerator(device.index())
                                             : at::make_generator<at::CPUGeneratorImpl>();
  generator.set_current_seed(seed);
  return generator;
}

DataSource DataSource::from_dataset(std::shared_ptr<const Dataset> dataset, bool shuffle,
                                    bool drop_last) {
  TANDEM_CHECK_ARG(dataset != nullptr, "DataSource::from_dataset needs a dataset, got none");
  TANDEM_CHECK_ARG(dataset->size() > 0, "the dataset is empty: expected at least one sample");
  DataSource s;
  s.kind_ = Kind::kDataset;
  s.dataset_ = std::move(dataset);
  s.shuffle_ = shuffle;
  s.drop_last_ = drop_last;
  return s;
}

DataSource DataSource::sized_to_run(DatasetFactory factory) {
  TANDEM_CHECK_ARG(static_cast<bool>(factory), "DataSource::sized_to_run needs a factory");
  DataSource s;
  s.kind_ = Kind::kSizedToRun;
  s.factory_ = std::move(factory);
  s.dataset_ = s.factory_(0);  // tells the fields
  TANDEM_CHECK_ARG(s.dataset_ != nullptr, "the dataset factory returned no dataset");
  s.drop_last_ = false;  // the run is sized to its samples: a short last batch is wanted
  return s;
}

DataSource DataSource::resident(std::vector<Batch> batches) {
  TANDEM_CHECK_ARG(!batches.empty(), "DataSource::resident needs at least one batch");
  const auto& first = batches.front().tensors();
  for (size_t b = 0; b < batches.size(); ++b) {
    const auto& fields = batches[b].tensors();
    TANDEM_CHECK_ARG(fields.size() == first.size(), "resident batch ", b, " has ", fields.size(),
                     " fields, batch 0 has ", first.size(), ": expected the same fields");
    for (size_t f = 0; f < fields.size(); ++f)
      TANDEM_CHECK_ARG(fields[f].first == first[f].first && fields[f].second.defined(),
                       "resident batch ", b, " field ", f, " is '", fields[f].first,
                       "': expected a defined tensor '", first[f].first, "' as in batch 0");
  }
  DataSource s;
  s.kind_ = Kind::kResident;
  s.batches_ = std::move(batches);
  return s;
}

std::vector<std::string> DataSource::field_names() const {
  std::vector<std::string> names;
  if (kind_ == Kind::kResident) {
    for (const auto& [name, tensor] : batches_.front().tensors()) names.push_back(name);
  } else if (dataset_) {
    for (const auto& f : packed_fields(dataset_->fields())) names.push_back(f.name);
  }
  return names;
}

int64_t DataSource::host_sample_bytes() const {
  if (!dataset_ || kind_ == Kind::kResident) return 0;
  return sample_bytes(packed_fields(dataset_->fields()));
}

void Workload::validate() const {
  TANDEM_CHECK_ARG(data.kind() != DataSource::Kind::kNone, "workload '", name,
                   "' has no data source: set Workload::data (DataSource::from_dataset, "
                   "sized_to_run or resident)");
  std::vector<std::string> available = data.field_names();
  std::set<std::string> stage_names{"load"};  // the runner's own stage
  auto check_stage = [&](const std::string& stage, const std::vector<std::string>& inputs) {
    TANDEM_CHECK_ARG(!stage.empty(), "workload '", name, "' has a stage without a name");
    TANDEM_CHECK_ARG(stage_names.insert(stage).second, "workload '", name,
                     "' has two stages named '", stage,
                     "' (or one named 'load', the runner's): expected unique names");
    for (const auto& in : inputs)
      TANDEM_CHECK_ARG(std::find(available.begin(), available.end(), in) != available.end(),
                       "stage '", stage, "' of workload '", name, "' reads field '", in,
                       "', which neither the data source nor an earlier stage provides: "
                       "expected one of ",
                       join_choices(available));
  };
  for (const auto& f : feeds) {
    check_stage(f.name, f.inputs);
    TANDEM_CHECK_ARG(static_cast<bool>(f.fn), "feed stage '", f.name, "' has no function");
    TANDEM_CHECK_ARG(!f.outputs.empty(), "feed stage '", f.name,
                     "' has no outputs: expected the names of the fields it writes");
    for (const auto& out : f.outputs)
      if (std::find(available.begin(), available.end(), out) == available.end())
        available.push_back(out);
  }
  check_stage(train.name, train.inputs);
  TANDEM_CHECK_ARG(!train.lane.empty(), "train stage '", train.name, "' has no lane name");
  TANDEM_CHECK_ARG(static_cast<bool>(train.loss), "train stage '", train.name,
                   "' has no loss function: expected forward and loss over its inputs");
  TANDEM_CHECK_ARG(train.optimizer != nullptr, "train stage '", train.name,
                   "' has no optimizer: expected tandem::optim::Sgd, Adam or a "
                   "LibTorchOptimizer");
}

void check_params(const std::string& workload, const std::map<std::string, std::string>& params,
                  const std::vector<WorkloadParam>& known) {
  for (const auto& [key, value] : params) {
    const auto it = std::find_if(known.begin(), known.end(),
                                 [&](const WorkloadParam& p) { return p.key == key; });
    if (it == known.end()) {
      std::vector<std::string> keys;
      for (const auto& p : known) keys.push_back(p.key);
      throw InvalidArgument(detail::concat(
          "parameter '", key, "' is not known to workload ", workload, ": expected ",
          keys.empty() ? std::string("none (it takes no parameters)") : join_choices(keys)));
    }
    TANDEM_CHECK_ARG(it->choices.empty() || std::find(it->choices.begin(), it->choices.end(),
                                                      value) != it->choices.end(),
                     "parameter ", key, "='", value, "' is not valid for workload ", workload,
                     ": expected ", join_choices(it->choices));
  }
}

std::string param_or_default(const std::map<std::string, std::string>& params,
                             const std::vector<WorkloadParam>& known, const std::string& key) {
  const auto it = params.find(key);
  if (it != params.end()) return it->second;
  for (const auto& p : known)
    if (p.key == key) return p.choices.empty() ? std::string() : p.choices.front();
  throw InvalidArgument("parameter '" + key + "' is not declared");
}

int64_t DataSource::batches_per_epoch(int64_t batch_size, int64_t world_size) const {
  if (kind_ != Kind::kDataset || batch_size <= 0 || world_size < 1) return 0;
  // A rank's shard, as the runner's loader takes it.
  const int64_t n = DistributedSampler(dataset_->size(), world_size).num_samples();
  return drop_last_ ? n / batch_size : (n + batch_size - 1) / batch_size;
}

at::Tensor deterministic_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits, labels, {}, at::Reduction::None).mean();
}

}  // namespace tandem
