// Device collectives over NCCL (collectives.h): one communicator per process, its unique id
// from rank 0 through the store; collectives on the caller's current stream, grouped, so a
// capture of that stream records them into the graph. Compiled where nccl.h was found
// (TANDEM_HAVE_NCCL: the torch wheel's nvidia-nccl-cu13, the library libtorch_cuda loads).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>

#include "collectives.h"
#include "tandem/error.h"

#ifdef TANDEM_HAVE_NCCL
#include <nccl.h>
#endif

namespace tandem::distributed {

#ifdef TANDEM_HAVE_NCCL
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(detail::concat("NCCL ", what, " failed: ", ncclGetErrorString(r),
                               " (NCCL_DEBUG=INFO says more)"));
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      break;
  }
  throw InvalidArgument(detail::concat("NCCL collectives: a ", t.scalar_type(),
                                       " tensor: expected float, double, half, bfloat16 or an "
                                       "integer type"));
}

void check_tensor(const at::Tensor& t, c10::Device device) {
  TANDEM_CHECK_ARG(t.device() == device, "NCCL collectives: a tensor on ", t.device(),
                   ": expected this rank's ", device);
  TANDEM_CHECK_ARG(t.is_non_overlapping_and_dense(), "NCCL collectives: a tensor of shape ",
                   t.sizes(), " with strides ", t.strides(),
                   ": expected dense memory (contiguous in some layout)");
}

class NcclCollectives : public DeviceCollectives {
 public:
  NcclCollectives(c10d::Store& store, const std::string& key, int rank, int world,
                  c10::Device device)
      : device_(device) {
    ncclUniqueId id;
    if (rank == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* b = reinterpret_cast<const uint8_t*>(&id);
      store.set(key, std::vector<uint8_t>(b, b + sizeof id));
    } else {
      const std::vector<uint8_t> b = store.get(key);
      TORCH_CHECK(b.size() == sizeof id, "NCCL unique id of ", b.size(), " bytes: expected ",
                  sizeof id);
      std::memcpy(&id, b.data(), sizeof id);
    }
    c10::cuda::CUDAGuard guard(device);
    check(ncclCommInitRank(&comm_, world, id, rank), "ncclCommInitRank");
    int version = 0;
    ncclGetVersion(&version);
    name_ =
        detail::concat("NCCL ", version / 10000, ".", (version / 100) % 100, ".", version % 100);
  }
  ~NcclCollectives() override { shutdown(/*abort=*/true); }

  void all_reduce_mean_(const std::vector<at::Tensor>& tensors) override {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    for (const auto& t : tensors) check_tensor(t, device_);  // floating point: ProcessGroup
    check(ncclGroupStart(), "ncclGroupStart");
    for (const auto& t : tensors)
      check(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), ncclAvg, comm_,
                          stream),
            "ncclAllReduce");
    check(ncclGroupEnd(), "ncclGroupEnd (all-reduce)");
  }

  void broadcast_(const std::vector<at::Tensor>& tensors, int root) override {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    for (const auto& t : tensors) check_tensor(t, device_);
    check(ncclGroupStart(), "ncclGroupStart");
    for (const auto& t : tensors)
      check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, stream),
            "ncclBroadcast");
    check(ncclGroupEnd(), "ncclGroupEnd (broadcast)");
  }

  void all_gather_(const std::vector<at::Tensor>& inputs,
                   const std::vector<at::Tensor>& outputs) override {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    for (const auto& t : inputs) check_tensor(t, device_);
    for (const auto& t : outputs) check_tensor(t, device_);
    check(ncclGroupStart(), "ncclGroupStart");
    for (size_t i = 0; i < inputs.size(); ++i)
      check(ncclAllGather(inputs[i].data_ptr(), outputs[i].data_ptr(), inputs[i].numel(),
                          nccl_type(inputs[i]), comm_, stream),
            "ncclAllGather");
    check(ncclGroupEnd(), "ncclGroupEnd (all-gather)");
  }

  std::string name() const override { return name_; }

  void shutdown(bool abort) override {
    if (!comm_) return;
    if (abort)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  c10::Device device_;
  ncclComm_t comm_ = nullptr;
  std::string name_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_nccl_collectives(c10d::Store& store, const std::string& key,
                                                         int rank, int world, c10::Device device) {
  return std::make_unique<NcclCollectives>(store, key, rank, world, device);
}
#else
std::unique_ptr<DeviceCollectives> make_nccl_collectives(c10d::Store&, const std::string&, int, int,
                                                         c10::Device device) {
  throw Error(detail::concat("data parallel on ", device,
                             " needs NCCL, and tandem was built without nccl.h (pip install "
                             "nvidia-nccl-cu13 into the build's venv, then rebuild)"));
}
#endif

}  // namespace tandem::distributed
