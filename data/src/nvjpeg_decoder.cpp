// nvJPEG through dlopen: the library is resolved at run time into a table of function pointers
// typed from the real nvjpeg.h (decltype), so a wrong signature fails to compile rather than
// corrupting the stack, and a machine without libnvjpeg still loads libtandem_data. Where
// nvjpeg.h was not found at configure time (TANDEM_HAVE_NVJPEG_H unset) the decoder is compiled
// out and open() says so.
#include "tandem/data/nvjpeg_decoder.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codec_util.h"
#include "jpeg_markers.h"
#include "tandem/data/decode.h"
#include "tandem/error.h"
#include "tandem/hardware_queues.h"

#if TANDEM_HAVE_NVJPEG_H
#include <nvjpeg.h>
#endif

namespace tandem::data {

at::Tensor PackedImages::image(int64_t b) const {
  TANDEM_CHECK_ARG(b >= 0 && b < size(), "PackedImages::image: sample ", b,
                   " out of range; expected 0 <= b < ", size());
  const auto& s = sizes_host[static_cast<size_t>(b)];
  return packed.narrow(0, offsets_host[static_cast<size_t>(b)], s[0] * s[1] * s[2])
      .view({s[0], s[1], s[2]});
}

#if !TANDEM_HAVE_NVJPEG_H

// ---- compiled out: nvjpeg.h was not found at configure time (data/CMakeLists.txt).
namespace {
constexpr const char* kNoHeader =
    "tandem was built without nvjpeg.h (install the nvidia-nvjpeg wheel or the CUDA toolkit's "
    "nvJPEG and reconfigure)";
}  // namespace

struct NvjpegDecoder::State {};

bool NvjpegDecoder::available(std::string* why_not) {
  if (why_not) *why_not = kNoHeader;
  return false;
}

std::unique_ptr<NvjpegDecoder> NvjpegDecoder::open(int device, std::string* why_not,
                                                   NvjpegBackend) {
  TANDEM_CHECK_ARG(device >= 0, "NvjpegDecoder::open: device ", device,
                   " is negative; expected a CUDA device index >= 0");
  if (why_not) *why_not = kNoHeader;
  return nullptr;
}

NvjpegDecoder::NvjpegDecoder(int device, std::unique_ptr<State> state)
    : device_(device), state_(std::move(state)) {}
NvjpegDecoder::~NvjpegDecoder() = default;

PackedImages NvjpegDecoder::decode(const std::vector<EncodedImage>&, int64_t, cudaStream_t,
                                   HostBytes) {
  throw Error(kNoHeader);  // unreachable: open() never returns a decoder in this build
}

const char* NvjpegDecoder::backend() const { return "none"; }
bool NvjpegDecoder::has_hardware() const { return false; }
NvjpegDecoder::EngineRoom NvjpegDecoder::engine_room() const { return {}; }

#else  // TANDEM_HAVE_NVJPEG_H

namespace {

using detail::fail;

// The entry points tandem calls, typed from nvjpeg.h.
struct NvjpegApi {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegGetImageInfo) get_image_info = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  // Only for the hardware engines (which image they take); without them, no hardware path.
  decltype(&nvjpegJpegStreamCreate) stream_create = nullptr;
  decltype(&nvjpegJpegStreamDestroy) stream_destroy = nullptr;
  decltype(&nvjpegJpegStreamParseHeader) stream_parse_header = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) batched_supported = nullptr;
  // Optional (null where the library lacks it): room reserved in a hardware decode state.
  decltype(&nvjpegDecodeBatchedPreAllocate) batched_pre_allocate = nullptr;
  // Optional: what a parsed header says (sizes, components, subsampling), so an image the
  // engines' parse has read is not parsed again by nvjpegGetImageInfo.
  decltype(&nvjpegJpegStreamGetFrameDimensions) stream_frame_dimensions = nullptr;
  decltype(&nvjpegJpegStreamGetComponentsNum) stream_components = nullptr;
  decltype(&nvjpegJpegStreamGetChromaSubsampling) stream_subsampling = nullptr;
};

struct LoadedApi {
  NvjpegApi api;
  std::string error;     // empty when every required entry point resolved
  std::string hw_error;  // empty when the hardware path's entry points resolved too
};

// The soname matching the header's ABI: libnvjpeg.so.13 for CUDA 13's nvjpeg.h.
std::string soname() { return "libnvjpeg.so." + std::to_string(NVJPEG_VER_MAJOR); }

template <typename F>
void resolve(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(name);
}

LoadedApi load_api() {
  LoadedApi loaded;
  // The plain soname first (the CUDA toolkit's, or whatever LD_LIBRARY_PATH / ldconfig give),
  // then the file CMake found next to nvjpeg.h (the nvidia-nvjpeg wheel in tandem's venv).
  std::vector<std::string> candidates = {soname()};
#ifdef TANDEM_NVJPEG_FALLBACK_LIBRARY
  if (std::string(TANDEM_NVJPEG_FALLBACK_LIBRARY) != "")
    candidates.emplace_back(TANDEM_NVJPEG_FALLBACK_LIBRARY);
#endif
  void* lib = nullptr;
  std::string tried;
  for (const auto& name : candidates) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name + ": not found");
  }
  if (lib == nullptr) {
    loaded.error = "cannot load " + soname() + " (" + tried + ")";
    return loaded;
  }
  // Never dlclosed: handles may outlive any one decoder, and unloading a CUDA library while
  // its static destructors still have work at exit is a known source of crashes.
  std::string missing;
  NvjpegApi& a = loaded.api;
  resolve(lib, "nvjpegCreateEx", &a.create_ex, &missing);
  resolve(lib, "nvjpegDestroy", &a.destroy, &missing);
  resolve(lib, "nvjpegJpegStateCreate", &a.state_create, &missing);
  resolve(lib, "nvjpegJpegStateDestroy", &a.state_destroy, &missing);
  resolve(lib, "nvjpegGetImageInfo", &a.get_image_info, &missing);
  resolve(lib, "nvjpegDecodeBatchedInitialize", &a.batched_initialize, &missing);
  resolve(lib, "nvjpegDecodeBatched", &a.decode_batched, &missing);
  resolve(lib, "nvjpegDecode", &a.decode, &missing);
  if (!missing.empty()) loaded.error = soname() + " lacks " + missing;
  std::string missing_hw;
  resolve(lib, "nvjpegJpegStreamCreate", &a.stream_create, &missing_hw);
  resolve(lib, "nvjpegJpegStreamDestroy", &a.stream_destroy, &missing_hw);
  resolve(lib, "nvjpegJpegStreamParseHeader", &a.stream_parse_header, &missing_hw);
  resolve(lib, "nvjpegDecodeBatchedSupported", &a.batched_supported, &missing_hw);
  if (!missing_hw.empty()) loaded.hw_error = soname() + " lacks " + missing_hw;
  std::string optional;  // the engines decode without it, more slowly
  resolve(lib, "nvjpegDecodeBatchedPreAllocate", &a.batched_pre_allocate, &optional);
  std::string missing_info;  // headers then parsed twice, as before
  resolve(lib, "nvjpegJpegStreamGetFrameDimensions", &a.stream_frame_dimensions, &missing_info);
  resolve(lib, "nvjpegJpegStreamGetComponentsNum", &a.stream_components, &missing_info);
  resolve(lib, "nvjpegJpegStreamGetChromaSubsampling", &a.stream_subsampling, &missing_info);
  if (!missing_info.empty()) {
    a.stream_frame_dimensions = nullptr;
    a.stream_components = nullptr;
    a.stream_subsampling = nullptr;
  }
  return loaded;
}

// Loaded once per process (thread-safe static initialisation).
const LoadedApi& loaded_api() {
  static const LoadedApi loaded = load_api();
  return loaded;
}

std::string status_name(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS:
      return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG:
      return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "nvjpegStatus_t " + std::to_string(static_cast<int>(status));
}

// A failed decode of one image, as the one-line cause that follows the image's name.
std::string decode_failure(const char* call, nvjpegStatus_t status) {
  const std::string where = std::string(" (") + call + ": " + status_name(status) + ")";
  switch (status) {
    case NVJPEG_STATUS_BAD_JPEG:
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "corrupt or truncated JPEG" + where;
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "JPEG kind not supported by nvJPEG (decode_image may read it)" + where;
    default:
      return "nvJPEG failed to decode it" + where;
  }
}

bool load_or_explain(std::string* why_not) {
  const LoadedApi& loaded = loaded_api();
  if (!loaded.error.empty()) {
    if (why_not) *why_not = loaded.error;
    return false;
  }
  return true;
}

std::string first_bytes_hex(const uint8_t* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) {
    if (i > 0) head += ' ';
    head += kHex[p[i] >> 4];
    head += kHex[p[i] & 15];
  }
  return head;
}

// The paths a decode() used, as bits in the order backend() names them.
constexpr unsigned kUsedHardware = 1, kUsedHybrid = 2, kUsedDefault = 4;

const char* backend_name(unsigned used) {
  static const char* const kNames[8] = {
      "none",    "hardware",         "hybrid",         "hardware+hybrid",
      "default", "hardware+default", "hybrid+default", "hardware+hybrid+default"};
  return kNames[used & 7u];
}

// NVJPEG_BACKEND_GPU_HYBRID's batched decode runs the Huffman decode on the GPU only for
// batches larger than 50 (nvjpeg.h); below that it is the default backend's host decode.
constexpr size_t kHybridMinBatch = 51;

NvjpegBackend backend_from_environment() {
  const char* env = std::getenv("TANDEM_NVJPEG_BACKEND");
  if (env == nullptr || *env == '\0') return NvjpegBackend::kAuto;
  const std::string value(env);
  if (value == "auto") return NvjpegBackend::kAuto;
  if (value == "hardware") return NvjpegBackend::kHardware;
  if (value == "hybrid") return NvjpegBackend::kHybrid;
  if (value == "default") return NvjpegBackend::kDefault;
  throw InvalidArgument("TANDEM_NVJPEG_BACKEND=" + value +
                        " names no nvJPEG backend; expected auto, hardware, hybrid or default");
}

// nvjpegCreateEx with strict bitstream checking where the library knows the flag (a corrupt
// stream is an error, not a picture); an older library that rejects it gets the default.
// Its own cudaMalloc / cudaHostAlloc allocators: its buffers grow only to the largest batch,
// so their synchronising frees are rare, and the caching allocator's stream semantics would
// not know which stream nvJPEG last used a buffer on.
nvjpegStatus_t create_handle(const NvjpegApi& api, nvjpegBackend_t backend, unsigned flags,
                             nvjpegHandle_t* handle) {
  nvjpegStatus_t status = api.create_ex(backend, nullptr, nullptr, flags, handle);
  if (status != NVJPEG_STATUS_SUCCESS && flags != NVJPEG_FLAGS_DEFAULT)
    status = api.create_ex(backend, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, handle);
  if (status != NVJPEG_STATUS_SUCCESS) *handle = nullptr;
  return status;
}

// A batched decode state and what nvjpegDecodeBatchedInitialize was last called with on it:
// re-initialised only when the batch size or the output format changes, and after a failed
// batch (nvJPEG requires it to reset the state).
struct Batched {
  nvjpegJpegState_t state = nullptr;
  bool ready = false;
  int batch_size = 0;
  nvjpegOutputFormat_t format = NVJPEG_OUTPUT_RGB;
};

// One nvjpegDecodeBatched call's inputs and outputs (kept across calls: no reallocation).
struct Gathered {
  std::vector<const unsigned char*> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> destinations;

  void clear() {
    data.clear();
    lengths.clear();
    destinations.clear();
  }
};

// nvjpegDecodeBatched of `batch` on `b`, initialised first when needed: the status of whichever
// call failed (`*initialize_failed`, if given, says whether it was the initialisation), or
// success.
nvjpegStatus_t run_batched(const NvjpegApi& api, nvjpegHandle_t handle, Batched& b, Gathered& batch,
                           nvjpegOutputFormat_t format, cudaStream_t stream,
                           bool* initialize_failed = nullptr) {
  const int n = static_cast<int>(batch.data.size());
  if (initialize_failed) *initialize_failed = false;
  if (!b.ready || b.batch_size != n || b.format != format) {
    b.ready = false;
    const nvjpegStatus_t status =
        api.batched_initialize(handle, b.state, n, /*max_cpu_threads=*/1, format);
    if (status != NVJPEG_STATUS_SUCCESS) {
      if (initialize_failed) *initialize_failed = true;
      return status;
    }
    b.ready = true;
    b.batch_size = n;
    b.format = format;
  }
  const nvjpegStatus_t status = api.decode_batched(
      handle, b.state, batch.data.data(), batch.lengths.data(), batch.destinations.data(), stream);
  if (status != NVJPEG_STATUS_SUCCESS) b.ready = false;
  return status;
}

// A pinned host buffer the hardware path copies a batch's bitstreams into before decoding.
// nvJPEG may upload them with asynchronous copies on the stream: from pinned memory that is a
// plain DMA (from pageable memory the driver stages every image through a buffer of its own),
// and the caller's bytes, pinned or not, are free once decode() returns, as documented. Two
// buffers alternate, each rewritten only once the event recorded after the decode that last
// read it has completed: the host waits only when the GPU is two batches behind.
struct Staging {
  uint8_t* data = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool pending = false;  // `done` was recorded after a decode that read `data`
};

// nvJPEG's hardware path runs each image on one of 14 streams of its own, and waits on the host
// for the image 14 before it; with few hardware queues some of those streams share one with the
// training lane, and one image held behind a queued step holds the whole batch
// (hardware_queues.h). Said once per process.
void warn_if_few_hardware_queues() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int queues = hardware_queues();
    if (queues >= kHardwareQueuesForEngines) return;
    std::cerr << "tandem: CUDA_DEVICE_MAX_CONNECTIONS is " << queues
              << ": the JPEG engines' streams share CUDA's hardware queues with the training "
                 "and wait behind its queued steps (ResNet-50 from large photos trained "
                 "1.18-1.25x slower with 8 than with "
              << kHardwareQueues << "); set it to " << kHardwareQueues
              << " before the program's first CUDA call (the tandem CLI does where it is unset)\n";
  });
}

}  // namespace

// The nvJPEG handles and decode states of one decoder: the default backend's (image headers,
// batched decode, and single-image decode to name a bad file), the hardware engines' (when the
// device has them and they are wanted) and GPU_HYBRID's (created on first use). Handles are
// bound to the device current when they are created, so every call below runs under a guard
// for the decoder's device.
struct NvjpegDecoder::State {
  const NvjpegApi* api = nullptr;
  NvjpegBackend prefer = NvjpegBackend::kAuto;

  nvjpegHandle_t handle = nullptr;     // default backend
  Batched batched;                     // its nvjpegDecodeBatched state
  nvjpegJpegState_t single = nullptr;  // its nvjpegDecode state, for the per-image fallback

  nvjpegHandle_t hw_handle = nullptr;  // hardware engines; null when not in use
  Batched hw;
  nvjpegJpegStream_t hw_stream = nullptr;  // one image's parsed headers: is it supported?
  std::array<Staging, 2> staging;
  int next_staging = 0;
  NvjpegDecoder::EngineRoom room;  // what the engines' state holds device memory for
  bool room_refused = false;       // nvJPEG refused a reservation: never asked again
  // Output formats the engines refused to initialise a batch for (bit 1: Y, bit 2: RGB): not
  // a property of any image, so those go straight to the other backends from then on.
  unsigned hw_refused_formats = 0;
  unsigned hw_decoded_formats = 0;  // formats the engines have decoded a batch to

  nvjpegHandle_t hybrid_handle = nullptr;  // GPU_HYBRID; null until used, or when it failed
  Batched hybrid;
  bool hybrid_tried = false;
  std::string hybrid_error;

  unsigned last_used = 0;  // backend()'s bits for the last non-empty batch
  // Recorded after each decode's work on its stream; the next decode waits for it, so at most
  // one batch is in flight in the decode states and buffers this decoder reuses (the pipeline
  // runs ahead of the device: in a graphed mode the next batch's decode was issued while the
  // last one's was still in flight, and the losses went non-finite).
  cudaEvent_t previous_done = nullptr;
  bool previous_pending = false;
  // Where the decodes' outputs are allocated (see decode(), step 2); from the device's pool on
  // first use.
  std::optional<c10::cuda::CUDAStream> output_stream;
  Gathered hw_batch, rest_batch;
  std::vector<uint8_t> on_hardware;

  ~State() {  // statuses ignored: a destructor never throws
    if (previous_done) {
      if (previous_pending) cudaEventSynchronize(previous_done);
      cudaEventDestroy(previous_done);
    }
    if (api == nullptr) return;
    release_hardware();
    for (Batched* b : {&hybrid, &batched})
      if (b->state) api->state_destroy(b->state);
    if (single) api->state_destroy(single);
    if (hybrid_handle) api->destroy(hybrid_handle);
    if (handle) api->destroy(handle);
  }

  // The hardware engines' handle, state, header stream and staging events, or false with `why`.
  bool open_hardware(std::string* why) {
    const LoadedApi& loaded = loaded_api();
    if (!loaded.hw_error.empty()) {
      *why = loaded.hw_error;
      return false;
    }
    nvjpegStatus_t status =
        create_handle(*api, NVJPEG_BACKEND_HARDWARE, NVJPEG_FLAGS_DEFAULT, &hw_handle);
    if (status != NVJPEG_STATUS_SUCCESS) {
      *why = "nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE): " + status_name(status);
      return false;
    }
    status = api->state_create(hw_handle, &hw.state);
    if (status != NVJPEG_STATUS_SUCCESS) {
      hw.state = nullptr;
    } else {
      status = api->stream_create(hw_handle, &hw_stream);
      if (status != NVJPEG_STATUS_SUCCESS) hw_stream = nullptr;
    }
    if (status != NVJPEG_STATUS_SUCCESS) {
      *why = "nvJPEG hardware state: " + status_name(status);
      release_hardware();
      return false;
    }
    for (Staging& st : staging) {
      if (cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming) != cudaSuccess) {
        st.done = nullptr;
        *why = std::string("cudaEventCreateWithFlags: ") + cudaGetErrorString(cudaGetLastError());
        release_hardware();
        return false;
      }
    }
    return true;
  }

  void release_hardware() {
    for (Staging& st : staging) {
      if (st.done) {
        if (st.pending) cudaEventSynchronize(st.done);
        cudaEventDestroy(st.done);
      }
      if (st.data) cudaFreeHost(st.data);
      st = Staging{};
    }
    if (hw_stream) api->stream_destroy(hw_stream);
    if (hw.state) api->state_destroy(hw.state);
    if (hw_handle) api->destroy(hw_handle);
    hw_stream = nullptr;
    hw = Batched{};
    hw_handle = nullptr;
  }

  // GPU_HYBRID's handle and batched state, created on first use; false (with `why`, if given)
  // when that failed, then and on every later call.
  bool ensure_hybrid(std::string* why) {
    if (!hybrid_tried) {
      hybrid_tried = true;
      nvjpegStatus_t status = create_handle(*api, NVJPEG_BACKEND_GPU_HYBRID,
                                            NVJPEG_FLAGS_BITSTREAM_STRICT, &hybrid_handle);
      if (status == NVJPEG_STATUS_SUCCESS) {
        status = api->state_create(hybrid_handle, &hybrid.state);
        if (status != NVJPEG_STATUS_SUCCESS) {
          hybrid.state = nullptr;
          api->destroy(hybrid_handle);
          hybrid_handle = nullptr;
        }
      }
      if (status != NVJPEG_STATUS_SUCCESS)
        hybrid_error = "nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID): " + status_name(status);
    }
    if (hybrid_handle == nullptr && why) *why = hybrid_error;
    return hybrid_handle != nullptr;
  }

  static unsigned format_bit(nvjpegOutputFormat_t format) {
    return format == NVJPEG_OUTPUT_Y ? 1u : 2u;
  }

  // Whether the hardware engines take this JPEG (baseline, one scan, a subsampling they know)
  // to `format`.
  bool hardware_supports(const uint8_t* p, size_t n, nvjpegOutputFormat_t format) {
    if (hw_handle == nullptr || (hw_refused_formats & format_bit(format)) != 0) return false;
    if (api->stream_parse_header(hw_handle, p, n, hw_stream) != NVJPEG_STATUS_SUCCESS) return false;
    return hardware_supports_parsed(format);
  }

  // The same for the image whose header hw_stream holds (read_header's).
  bool hardware_supports_parsed(nvjpegOutputFormat_t format) {
    if ((hw_refused_formats & format_bit(format)) != 0) return false;
    int is_supported = -1;  // 0 means supported (nvjpeg.h)
    return api->batched_supported(hw_handle, hw_stream, &is_supported) == NVJPEG_STATUS_SUCCESS &&
           is_supported == 0;
  }

  // An image's header read once, by the engines' parse into hw_stream, which then answers both
  // what nvjpegGetImageInfo would (sizes, components, subsampling) and whether the engines take
  // it: the engines' thread read every header twice before, 4-6 ms a batch of photos during
  // which the engines sat idle. False (nothing read) without the engines or the stream's
  // getters, or where the parse fails: the caller then asks nvjpegGetImageInfo, whose status
  // names what is wrong.
  bool read_header(const uint8_t* p, size_t n, int* components,
                   nvjpegChromaSubsampling_t* subsampling, int64_t* height, int64_t* width) {
    if (hw_handle == nullptr || api->stream_frame_dimensions == nullptr) return false;
    if (api->stream_parse_header(hw_handle, p, n, hw_stream) != NVJPEG_STATUS_SUCCESS) return false;
    unsigned int w = 0, h = 0, nc = 0;
    if (api->stream_frame_dimensions(hw_stream, &w, &h) != NVJPEG_STATUS_SUCCESS ||
        api->stream_components(hw_stream, &nc) != NVJPEG_STATUS_SUCCESS ||
        api->stream_subsampling(hw_stream, subsampling) != NVJPEG_STATUS_SUCCESS)
      return false;
    *components = static_cast<int>(nc);
    *height = h;
    *width = w;
    return true;
  }

  // Room in the engines' decode state for `rows` images of up to `height` x `width`. Without it
  // nvJPEG frees and allocates its device buffers whenever a batch's images differ in size
  // from the last one's — every batch of photos — and a device free waits for all the work
  // queued on the device, the training's steps included: beside ResNet-50 from photos of
  // 1000-2000 px the engines' call took 39-43 ms a batch without it (and with the 1 x 1 room
  // NVIDIA's own hardware-decoder plugin asks for by default), 25-30 ms with it, for ~350 MB.
  // Grown only when a batch does not fit (a quarter more rows, sides to a multiple of 256), so
  // it is asked for a few times in a run; square, so a landscape and a portrait photo of the
  // same sides both fit; 4:4:4 and interleaved RGB, the most bytes per pixel, so any
  // subsampling fits. The state is initialised again after it.
  void reserve_hardware(int rows, int64_t height, int64_t width) {
    if (api->batched_pre_allocate == nullptr || room_refused) return;
    const int side = static_cast<int>(std::max(height, width));
    if (rows <= room.rows && side <= room.side) return;
    const auto round_up = [](int v, int to) { return (v + to - 1) / to * to; };
    NvjpegDecoder::EngineRoom want;
    want.rows = std::max(room.rows, round_up(rows + rows / 4, 16));
    want.side = std::max(room.side, round_up(side, 256));
    if (api->batched_pre_allocate(hw_handle, hw.state, want.rows, want.side, want.side,
                                  NVJPEG_CSS_444, NVJPEG_OUTPUT_RGBI) != NVJPEG_STATUS_SUCCESS) {
      room_refused = true;  // the engines decode as they did without it
      return;
    }
    room = want;
    hw.ready = false;
  }

  // The images `which` on the hardware engines, their bitstreams read in place where the caller
  // keeps them pinned until the stream's work is done (`in_place`), else staged in pinned
  // memory; false when nvJPEG refused the batch (nothing thrown: the caller decodes them
  // another way).
  bool decode_hardware(const std::vector<EncodedImage>& images, const std::vector<size_t>& which,
                       const std::vector<nvjpegImage_t>& destinations, nvjpegOutputFormat_t format,
                       cudaStream_t stream, bool in_place) {
    size_t total = 0;
    for (size_t b : which) total += images[b].size;
    Staging* st = in_place ? nullptr : next_staging_buffer(total);
    Gathered& g = hw_batch;
    g.clear();
    size_t at = 0;
    for (size_t b : which) {
      const uint8_t* src = images[b].data;
      if (st) {
        std::memcpy(st->data + at, src, images[b].size);
        src = st->data + at;
        at += images[b].size;
      }
      g.data.push_back(src);
      g.lengths.push_back(images[b].size);
      g.destinations.push_back(destinations[b]);
    }
    const bool decoded = run_engines(g, format, stream);
    if (st) {
      if (cudaEventRecord(st->done, stream) == cudaSuccess) {
        st->pending = true;
      } else {  // no event to wait on before the buffer is rewritten: wait for the copy now
        cudaGetLastError();
        cudaStreamSynchronize(stream);
      }
    }
    return decoded;
  }

  // The staging buffer to copy the next `total` bytes into, once the decode that last read it
  // is done, grown when too small; nullptr where pinned memory could not be had (the engines
  // then read the caller's bytes, which stay valid for the call).
  Staging* next_staging_buffer(size_t total) {
    Staging& st = staging[static_cast<size_t>(next_staging)];
    next_staging ^= 1;
    if (st.pending) {  // the decode that last read this buffer must be done with it
      cudaEventSynchronize(st.done);
      st.pending = false;
    }
    if (st.capacity < total) {
      if (st.data) cudaFreeHost(st.data);
      st.data = nullptr;
      st.capacity = 0;
      const size_t want = std::max<size_t>(total + total / 4, size_t{1} << 20);
      void* p = nullptr;
      if (cudaHostAlloc(&p, want, cudaHostAllocDefault) == cudaSuccess) {
        st.data = static_cast<uint8_t*>(p);
        st.capacity = want;
      } else {
        cudaGetLastError();  // not sticky
      }
    }
    return st.data ? &st : nullptr;
  }

  // One batch on the engines; remembers the output formats they refused or decoded.
  bool run_engines(Gathered& g, nvjpegOutputFormat_t format, cudaStream_t stream) {
    bool initialize_failed = false;
    // The engines do not wait for the work queued before them on `stream`; the output they
    // write is a block no earlier work can still read (decode(), step 2), so nothing here
    // waits for the stream.
    const nvjpegStatus_t status =
        run_batched(*api, hw_handle, hw, g, format, stream, &initialize_failed);
    // The engines refused to initialise for a format they never decoded to: never again.
    if (initialize_failed && (hw_decoded_formats & format_bit(format)) == 0)
      hw_refused_formats |= format_bit(format);
    if (status == NVJPEG_STATUS_SUCCESS) hw_decoded_formats |= format_bit(format);
    return status == NVJPEG_STATUS_SUCCESS;
  }

  // The images `which` (in batch order) without the engines: GPU_HYBRID's batched decode for a
  // batch it runs on the GPU (or always, when preferred), else the default backend's; a batch
  // either refuses is decoded again image by image with nvjpegDecode, and the first image that
  // fails there is the one the error names (a failed batch names none). Rewriting slots in
  // stream order is safe: the later write wins. Returns the backend bit that decoded.
  unsigned decode_rest(const std::vector<EncodedImage>& images, const std::vector<size_t>& which,
                       const std::vector<nvjpegImage_t>& destinations, nvjpegOutputFormat_t format,
                       cudaStream_t stream) {
    Gathered& g = rest_batch;
    g.clear();
    for (size_t b : which) {
      g.data.push_back(images[b].data);
      g.lengths.push_back(images[b].size);
      g.destinations.push_back(destinations[b]);
    }
    const bool try_hybrid = prefer == NvjpegBackend::kHybrid ||
                            (prefer != NvjpegBackend::kDefault && which.size() >= kHybridMinBatch);
    if (try_hybrid && ensure_hybrid(nullptr) &&
        run_batched(*api, hybrid_handle, hybrid, g, format, stream) == NVJPEG_STATUS_SUCCESS)
      return kUsedHybrid;
    if (run_batched(*api, handle, batched, g, format, stream) == NVJPEG_STATUS_SUCCESS)
      return kUsedDefault;
    for (size_t k = 0; k < which.size(); ++k) {
      const nvjpegStatus_t status =
          api->decode(handle, single, g.data[k], g.lengths[k], format, &g.destinations[k], stream);
      if (status != NVJPEG_STATUS_SUCCESS)
        fail(images[which[k]].name, decode_failure("nvjpegDecode", status));
    }
    return kUsedDefault;
  }
};

bool NvjpegDecoder::available(std::string* why_not) {
  if (!load_or_explain(why_not)) return false;
  if (c10::cuda::device_count() == 0) {
    if (why_not) *why_not = "no CUDA device on this machine";
    return false;
  }
  return true;
}

std::unique_ptr<NvjpegDecoder> NvjpegDecoder::open(int device, std::string* why_not,
                                                   NvjpegBackend prefer) {
  TANDEM_CHECK_ARG(device >= 0, "NvjpegDecoder::open: device ", device,
                   " is negative; expected a CUDA device index >= 0");
  if (prefer == NvjpegBackend::kAuto) prefer = backend_from_environment();
  if (!available(why_not)) return nullptr;
  const int count = c10::cuda::device_count();
  TANDEM_CHECK_ARG(device < count, "NvjpegDecoder::open: device ", device,
                   " does not exist; this machine has ", count, " CUDA device(s)");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const std::string where = " on cuda:" + std::to_string(device);

  auto state = std::make_unique<State>();
  state->api = &loaded_api().api;
  state->prefer = prefer;
  const NvjpegApi& api = *state->api;
  // The default backend lets nvJPEG pick hybrid (host Huffman) or GPU-assisted Huffman per
  // image; it is every path's last resort, and reads the headers.
  nvjpegStatus_t status =
      create_handle(api, NVJPEG_BACKEND_DEFAULT, NVJPEG_FLAGS_BITSTREAM_STRICT, &state->handle);
  if (status != NVJPEG_STATUS_SUCCESS) {
    if (why_not) *why_not = "nvjpegCreateEx failed" + where + ": " + status_name(status);
    return nullptr;
  }
  for (nvjpegJpegState_t* s : {&state->batched.state, &state->single}) {
    status = api.state_create(state->handle, s);
    if (status != NVJPEG_STATUS_SUCCESS) {
      *s = nullptr;
      if (why_not) *why_not = "nvjpegJpegStateCreate failed: " + status_name(status);
      return nullptr;
    }
  }
  if (prefer == NvjpegBackend::kAuto || prefer == NvjpegBackend::kHardware) {
    std::string why_hw;
    if (!state->open_hardware(&why_hw) && prefer == NvjpegBackend::kHardware) {
      if (why_not) *why_not = "no nvJPEG hardware decoder" + where + " (" + why_hw + ")";
      return nullptr;
    }
    if (state->hw_handle != nullptr) warn_if_few_hardware_queues();
  }
  if (prefer == NvjpegBackend::kHybrid) {
    std::string why_hybrid;
    if (!state->ensure_hybrid(&why_hybrid)) {
      if (why_not) *why_not = "no nvJPEG GPU_HYBRID backend" + where + " (" + why_hybrid + ")";
      return nullptr;
    }
  }
  return std::unique_ptr<NvjpegDecoder>(new NvjpegDecoder(device, std::move(state)));
}

NvjpegDecoder::NvjpegDecoder(int device, std::unique_ptr<State> state)
    : device_(device), state_(std::move(state)) {}

NvjpegDecoder::~NvjpegDecoder() {
  // nvJPEG frees its buffers on the device it was created on; no guard object here (its
  // constructor may throw), the raw calls with their errors ignored.
  int previous = -1;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
  if (restore) cudaSetDevice(device_);
  state_.reset();
  if (restore) cudaSetDevice(previous);
}

const char* NvjpegDecoder::backend() const { return backend_name(state_->last_used); }

bool NvjpegDecoder::has_hardware() const { return state_->hw_handle != nullptr; }

NvjpegDecoder::EngineRoom NvjpegDecoder::engine_room() const { return state_->room; }

PackedImages NvjpegDecoder::decode(const std::vector<EncodedImage>& images, int64_t channels,
                                   cudaStream_t stream, HostBytes bytes) {
  TANDEM_CHECK_ARG(channels == 1 || channels == 3, "NvjpegDecoder::decode: channels ", channels,
                   " not supported; expected 1 (gray) or 3 (RGB)");
  State& s = *state_;
  const NvjpegApi& api = *s.api;
  const size_t batch = images.size();
  if (s.previous_pending) {
    TANDEM_CUDA_CHECK(cudaEventSynchronize(s.previous_done));
    s.previous_pending = false;
  }
  const nvjpegOutputFormat_t format = channels == 3 ? NVJPEG_OUTPUT_RGB : NVJPEG_OUTPUT_Y;
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));

  // 1. Headers, on the host: validate every image and size its slot before any GPU work, so a
  //    bad file fails the call before anything is queued; and which images the hardware
  //    engines take.
  PackedImages out;
  out.offsets_host.resize(batch);
  out.sizes_host.resize(batch);
  s.on_hardware.assign(batch, 0);
  int64_t total = 0;
  for (size_t b = 0; b < batch; ++b) {
    const EncodedImage& im = images[b];
    TANDEM_CHECK_ARG(im.data != nullptr || im.size == 0, "NvjpegDecoder::decode: image ", b, " (",
                     im.name, ") has ", im.size, " bytes at a null pointer");
    if (im.size == 0) fail(im.name, "empty file (0 bytes), not an image");
    const ImageFormat kind = sniff_format(im.data, im.size);
    if (kind == ImageFormat::kPng)
      fail(im.name,
           "a PNG, not a JPEG: the GPU decoder reads JPEGs only (decode_image reads "
           "PNGs)");
    if (kind != ImageFormat::kJpeg)
      fail(im.name,
           "not a JPEG file (it starts with bytes " + first_bytes_hex(im.data, im.size) + ")");
    int components = 0;
    nvjpegChromaSubsampling_t subsampling = NVJPEG_CSS_UNKNOWN;
    int64_t height = 0, width = 0;
    const detail::JpegMarkers markers = detail::walk_markers(im.data, im.size);
    const bool parsed_once =
        s.read_header(im.data, im.size, &components, &subsampling, &height, &width);
    if (!parsed_once) {
      int widths[NVJPEG_MAX_COMPONENT] = {0};
      int heights[NVJPEG_MAX_COMPONENT] = {0};
      const nvjpegStatus_t status = api.get_image_info(s.handle, im.data, im.size, &components,
                                                       &subsampling, widths, heights);
      if (status != NVJPEG_STATUS_SUCCESS && markers.components == 4)
        components = 4;
      else if (status != NVJPEG_STATUS_SUCCESS)
        fail(im.name, (status == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
                               status == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED
                           ? "JPEG kind not supported by nvJPEG (nvjpegGetImageInfo: "
                           : "corrupt or truncated JPEG header (nvjpegGetImageInfo: ") +
                          status_name(status) + ")");
      height = heights[0];  // component 0: full-resolution luma
      width = widths[0];
    }
    if (components == 4)
      fail(im.name,
           "CMYK / YCCK JPEG (4 components): not supported by the GPU decoder "
           "(decode_image reads it)");
    if (components != 1 && components != 3)
      fail(im.name, "JPEG with " + std::to_string(components) +
                        " components: not supported by the GPU decoder (expected 1 or 3)");
    if (subsampling == NVJPEG_CSS_UNKNOWN)
      fail(im.name, "JPEG with a chroma subsampling nvJPEG does not support");
    if (!detail::has_end_after_scan(im.data, im.size, markers.first_scan))
      fail(im.name, "corrupt or truncated JPEG (no end-of-image marker after the image data)");
    detail::check_pixel_count(height, width, im.name);
    out.sizes_host[b] = {channels, height, width};
    out.offsets_host[b] = total;
    total += channels * height * width;
    s.on_hardware[b] = (parsed_once ? s.hardware_supports_parsed(format)
                                    : s.hardware_supports(im.data, im.size, format))
                           ? 1
                           : 0;
  }

  // 2. Output. The engines write it without waiting for the work queued before them on
  //    `stream` (they are not stream-ordered), so its block must be one no queued kernel still
  //    reads: a block the caching allocator hands back on `stream` may have been freed by a
  //    tensor whose readers are still queued there (in mode graphed, the previous step's graph
  //    read such a block and the losses went non-finite). So the output is allocated on a
  //    stream of the decoder's own, on which only decodes' outputs are allocated, and marked as
  //    used on `stream`: freed, its block is reused only once the work queued on `stream` by
  //    then has completed (recordStream), which the allocator checks without blocking — where
  //    a wait for the whole stream before each engines' batch would hold the caller's thread.
  const auto index = static_cast<c10::DeviceIndex>(device_);
  const c10::cuda::CUDAStream lane = stream != nullptr
                                         ? c10::cuda::getStreamFromExternal(stream, index)
                                         : c10::cuda::getDefaultCUDAStream(index);
  if (!s.output_stream) s.output_stream = c10::cuda::getStreamFromPool(false, index);
  const auto on_device = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, index);
  {
    c10::cuda::CUDAStreamGuard output_guard(*s.output_stream);
    out.packed = at::empty({total}, on_device);
  }
  if (total > 0)
    c10::cuda::CUDACachingAllocator::recordStream(out.packed.storage().data_ptr(), lane);
  c10::cuda::CUDAStreamGuard stream_guard(lane);
  {
    // offsets (B,) and sizes (B, 3) as two views of one (4B,) int64 block: one pinned staging
    // block (the caching host allocator keeps it until the copy is done) and one asynchronous
    // copy on the lane.
    const auto n = static_cast<int64_t>(batch);
    at::Tensor both = at::empty({4 * n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    int64_t* p = both.data_ptr<int64_t>();
    std::copy(out.offsets_host.begin(), out.offsets_host.end(), p);
    for (size_t b = 0; b < batch; ++b)
      std::copy(out.sizes_host[b].begin(), out.sizes_host[b].end(), p + n + 3 * b);
    const at::Tensor on_gpu = both.to(on_device.dtype(at::kLong), /*non_blocking=*/true);
    out.offsets = on_gpu.narrow(0, 0, n);
    out.sizes = on_gpu.narrow(0, n, 3 * n).view({n, 3});
  }
  if (batch == 0) return out;

  // 3. Planar destinations inside `packed`: channel c of sample b is its (H, W) plane at
  //    offsets[b] + c*H*W, pitch W. Planar RGB / Y output writes each plane separately, so the
  //    (C, H, W) layout needs no transpose afterwards.
  std::vector<nvjpegImage_t> destinations(batch);
  uint8_t* base = out.packed.data_ptr<uint8_t>();
  for (size_t b = 0; b < batch; ++b) {
    const auto [c, h, w] = out.sizes_host[b];
    nvjpegImage_t& d = destinations[b];
    d = nvjpegImage_t{};
    for (int64_t k = 0; k < c; ++k) {
      d.channel[k] = base + out.offsets_host[b] + k * h * w;
      d.pitch[k] = static_cast<size_t>(w);
    }
  }

  // 4. Batched calls: nvJPEG decodes a whole batch with one set of kernels (or one submission
  //    to the hardware engines), where per-image calls would launch per image. The images the
  //    engines take go there; the rest, and all of them if the engines refuse the batch, go
  //    through decode_rest (which names a bad file). The decoupled API would give per-image
  //    errors up front but costs a parse, a host and a device phase per image, with their own
  //    buffers; not worth it while bad files are rare.
  std::vector<size_t> on_hardware, rest;
  for (size_t b = 0; b < batch; ++b) (s.on_hardware[b] ? on_hardware : rest).push_back(b);
  unsigned used = 0;
  if (!on_hardware.empty()) {
    int64_t height = 0, width = 0;
    for (size_t b : on_hardware) {
      height = std::max(height, out.sizes_host[b][1]);
      width = std::max(width, out.sizes_host[b][2]);
    }
    s.reserve_hardware(static_cast<int>(on_hardware.size()), height, width);
    if (s.decode_hardware(images, on_hardware, destinations, format, stream,
                          bytes == HostBytes::kPinnedUntilStreamDone)) {
      used |= kUsedHardware;
    } else {
      rest.insert(rest.end(), on_hardware.begin(), on_hardware.end());
      std::sort(rest.begin(), rest.end());  // an error names the first bad image in batch order
    }
  }
  if (!rest.empty()) used |= s.decode_rest(images, rest, destinations, format, stream);
  s.last_used = used;
  if (!s.previous_done)
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&s.previous_done, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventRecord(s.previous_done, stream));
  s.previous_pending = true;
  return out;
}

#endif  // TANDEM_HAVE_NVJPEG_H

}  // namespace tandem::data
