// cuDNN's fused convolution graphs through NVIDIA's C++ frontend (see cudnn_conv_graphs.h). The
// frontend is used in its dynamic-loading mode: it finds cuDNN's backend functions in the
// libcudnn.so.9 LibTorch loaded, so nothing here links cuDNN and the graphs run on the same
// cuDNN as LibTorch's own convolutions. Compiled with hidden visibility (models/CMakeLists.txt):
// LibTorch carries a frontend of its own, and its inline functions must not stand in for these.
#include "cudnn_conv_graphs.h"

#if defined(TANDEM_HAVE_CUDNN_FRONTEND)

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <ATen/native/ConvUtils.h>
#include <c10/core/MemoryFormat.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

// The frontend's dynamic-loading mode reads cuDNN's functions through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace tandem::models::detail {
namespace {

namespace fe = cudnn_frontend;

// Tensor ids in the graphs' variant packs.
enum Uid : int64_t { kX = 1, kW, kY, kSum, kSquares, kScale, kBias };

// The graph's forms, tried in order until cuDNN has an engine for one: the convolution alone
// before its statistics; then with an identity prologue (x * 1 + 0, and that followed by a
// ReLU where x is known to be non-negative), the forms of NVIDIA's fused ResNet-50, whose
// specialized engines may take a shape the plain form is refused for. The values are the same.
enum class Prologue { kNone, kScaleBias, kScaleBiasRelu };

// One shape's graph: built (or refused) once, then executed.
struct ConvStatsGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null where cuDNN had no engine
  int64_t workspace = 0;
  std::string why_not;
  at::Tensor ones, zeros;  // the identity prologue's scale and bias, (C,) half
  // execute() fills the graph's own variant-pack buffers: one thread at a time (lanes on
  // several threads may share a shape).
  std::mutex running;
};

std::string describe(fe::error_t e, const char* stage) {
  return std::string(stage) + ": " + e.get_message();
}

// x's and w's sizes and strides as the graph takes them (LibTorch's channels-last strides are
// the frontend's NHWC strides over N, C, H, W dims).
std::vector<int64_t> vec(at::IntArrayRef a) { return {a.begin(), a.end()}; }

// An input of the graph laid out as the tensor it will be given.
std::shared_ptr<fe::graph::Tensor_attributes> input_like(fe::graph::Graph& g, const char* name,
                                                         Uid uid, const at::Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(vec(t.sizes()))
                      .set_stride(vec(t.strides()))
                      .set_data_type(fe::DataType_t::HALF));
}

fe::graph::Pointwise_attributes pointwise(fe::PointwiseMode_t mode, const char* name) {
  return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(
      fe::DataType_t::FLOAT);
}

// The graph in one form, as far as a plan cuDNN built for it; its failure's stage and message
// in `why` where there is none.
std::shared_ptr<fe::graph::Graph> build_form(const at::Tensor& x, const at::Tensor& w,
                                             at::IntArrayRef stride, at::IntArrayRef padding,
                                             at::IntArrayRef y_sizes, at::IntArrayRef y_strides,
                                             Prologue prologue, int64_t& workspace,
                                             std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto X = input_like(*g, "x", kX, x);
  auto W = input_like(*g, "w", kW, w);
  auto conv_input = X;
  if (prologue != Prologue::kNone) {
    const int64_t c = x.size(1);
    auto per_channel = [&](const char* name, Uid uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({1, c, 1, 1})
                           .set_stride({c, 1, c, c})
                           .set_data_type(fe::DataType_t::HALF));
    };
    auto scaled =
        g->pointwise(X, per_channel("scale", kScale), pointwise(fe::PointwiseMode_t::MUL, "scale"));
    conv_input = g->pointwise(scaled, per_channel("bias", kBias),
                              pointwise(fe::PointwiseMode_t::ADD, "bias"));
    if (prologue == Prologue::kScaleBiasRelu)
      conv_input = g->pointwise(conv_input, pointwise(fe::PointwiseMode_t::RELU_FWD, "relu"));
  }
  auto Y = g->conv_fprop(conv_input, W,
                         fe::graph::Conv_fprop_attributes()
                             .set_name("conv")
                             .set_padding(vec(padding))
                             .set_stride(vec(stride))
                             .set_dilation({1, 1}));
  Y->set_output(true)
      .set_uid(kY)
      .set_dim(vec(y_sizes))
      .set_stride(vec(y_strides))
      .set_data_type(fe::DataType_t::HALF);
  auto [S, SQ] = g->genstats(Y, fe::graph::Genstats_attributes().set_name("stats"));
  const int64_t k = y_sizes[1];
  for (auto& [t, uid] : {std::pair{S, kSum}, std::pair{SQ, kSquares}})
    t->set_output(true)
        .set_uid(uid)
        .set_dim({1, k, 1, 1})
        .set_stride({k, 1, k, k})
        .set_data_type(fe::DataType_t::FLOAT);

  cudnnHandle_t handle = at::native::getCudnnHandle();
  auto failed = [&](fe::error_t e, const char* stage) {
    why = describe(std::move(e), stage);
    return nullptr;
  };
  fe::error_t e = g->validate();
  if (e.is_bad()) return failed(e, "validate");
  e = g->build_operation_graph(handle);
  if (e.is_bad()) return failed(e, "build_operation_graph");
  e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_bad()) return failed(e, "create_execution_plans");
  // No engine cuDNN notes as nondeterministic. The genstats engines Hopper runs carry no such
  // note and still reduce in an order that varies on some shapes (the sums of two runs are not
  // the same bits; measured on an H100 and an H200): conv2d_with_stats is off where
  // deterministic algorithms are requested.
  g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  e = g->check_support();
  if (e.is_bad()) return failed(e, "check_support");
  e = g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (e.is_bad()) return failed(e, "build_plans");
  e = g->get_workspace_size(workspace);
  if (e.is_bad()) return failed(e, "get_workspace_size");
  return g;
}

std::shared_ptr<ConvStatsGraph> build(const at::Tensor& x, const at::Tensor& w,
                                      at::IntArrayRef stride, at::IntArrayRef padding,
                                      at::IntArrayRef y_sizes, at::IntArrayRef y_strides,
                                      bool input_nonnegative) {
  auto built = std::make_shared<ConvStatsGraph>();
  std::vector<Prologue> forms{Prologue::kNone, Prologue::kScaleBias};
  if (input_nonnegative) forms.push_back(Prologue::kScaleBiasRelu);
  for (const Prologue form : forms) {
    std::string why;
    built->graph =
        build_form(x, w, stride, padding, y_sizes, y_strides, form, built->workspace, why);
    if (built->graph) {
      if (form != Prologue::kNone) {
        built->ones = at::ones({x.size(1)}, x.options());
        built->zeros = at::zeros({x.size(1)}, x.options());
      }
      return built;
    }
    static const char* const kNames[] = {"plain", "with x*1+0", "with relu(x*1+0)"};
    built->why_not += (built->why_not.empty() ? "" : "; ") +
                      std::string(kNames[static_cast<int>(form)]) + ": " + why;
  }
  return built;
}

std::string key_of(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
                   at::IntArrayRef padding, bool input_nonnegative) {
  std::ostringstream key;
  key << input_nonnegative << '|' << x.get_device() << '|' << x.sizes() << x.strides() << '|'
      << w.sizes() << w.strides() << '|' << stride << padding;
  return key.str();
}

}  // namespace

// The library LibTorch loaded (it links libcudnn.so.9), else whichever the loader finds. Null if
// neither: no graphs then.
void* cudnn_library() {
  static void* handle = [] {
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = dlopen("libcudnn.so.9", RTLD_NOW);
    cudnn_frontend::cudnn_dlhandle = h;
    return h;
  }();
  return handle;
}

bool cudnn_graphs_compiled() { return true; }

bool cudnn_conv_with_stats(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                           at::IntArrayRef padding, bool input_nonnegative, at::Tensor& y,
                           at::Tensor& sums, std::string& why) {
  why.clear();
  if (cudnn_library() == nullptr) {
    static std::once_flag said;
    std::call_once(said, [&] { why = "libcudnn.so.9 could not be loaded"; });
    return false;
  }
  // The output as the convolution gives it, channels-last.
  const std::vector<int64_t> y_sizes =
      at::native::conv_output_size(x.sizes(), weight.sizes(), padding, stride, {1, 1});
  const std::vector<int64_t> y_strides = c10::get_channels_last_strides_2d(y_sizes);

  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<ConvStatsGraph>> graphs;
  std::shared_ptr<ConvStatsGraph> entry;
  {
    const std::string key = key_of(x, weight, stride, padding, input_nonnegative);
    std::lock_guard<std::mutex> lock(mutex);
    auto found = graphs.find(key);
    if (found == graphs.end()) {
      found = graphs
                  .emplace(key,
                           build(x, weight, stride, padding, y_sizes, y_strides, input_nonnegative))
                  .first;
      why = found->second->why_not;  // said once, where the shape was first seen
    }
    entry = found->second;
  }
  if (!entry->graph) return false;

  at::Tensor out = at::empty(y_sizes, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  at::Tensor stats = at::empty({2, weight.size(0)}, x.options().dtype(at::kFloat));
  at::Tensor workspace =
      at::empty({std::max<int64_t>(entry->workspace, 1)}, x.options().dtype(at::kByte));
  cudnnHandle_t handle = at::native::getCudnnHandle();
  // Through the frontend's shim: cuDNN's functions are found in the loaded library, not linked.
  TORCH_CHECK(
      fe::detail::set_stream(handle, at::cuda::getCurrentCUDAStream(x.get_device()).stream()) ==
          CUDNN_STATUS_SUCCESS,
      "cudnnSetStream failed");
  std::unordered_map<int64_t, void*> pack = {{kX, const_cast<void*>(x.const_data_ptr())},
                                             {kW, const_cast<void*>(weight.const_data_ptr())},
                                             {kY, out.mutable_data_ptr()},
                                             {kSum, stats[0].mutable_data_ptr()},
                                             {kSquares, stats[1].mutable_data_ptr()}};
  if (entry->ones.defined()) {
    pack[kScale] = entry->ones.mutable_data_ptr();
    pack[kBias] = entry->zeros.mutable_data_ptr();
  }
  fe::error_t e;
  {
    std::lock_guard<std::mutex> lock(entry->running);
    e = entry->graph->execute(handle, pack, workspace.mutable_data_ptr());
  }
  TORCH_CHECK(e.is_good(),
              "cuDNN's convolution + statistics graph failed to run: ", e.get_message());
  y = std::move(out);
  sums = std::move(stats);
  return true;
}

}  // namespace tandem::models::detail

#else  // no cuDNN frontend in this build

namespace tandem::models::detail {

bool cudnn_graphs_compiled() { return false; }

bool cudnn_conv_with_stats(const at::Tensor&, const at::Tensor&, at::IntArrayRef, at::IntArrayRef,
                           bool, at::Tensor&, at::Tensor&, std::string& why) {
  why.clear();
  return false;
}

}  // namespace tandem::models::detail

#endif
