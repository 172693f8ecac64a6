// NvjpegDecoder's entry points: open() picks the backends, decode() checks every header on the
// host, allocates the output and splits the batch between the hardware engines and the rest
// (their calls: nvjpeg_state.cpp). nvJPEG is loaded through dlopen (nvjpeg_api.cpp), so a
// machine without libnvjpeg still loads libtandem_data. Where nvjpeg.h was not found at
// configure time (TANDEM_HAVE_NVJPEG_H unset) the decoder is compiled out and open() says so.
#include "tandem/data/nvjpeg_decoder.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdlib>
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

#include "nvjpeg_api.h"
#include "nvjpeg_state.h"
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

using detail::create_handle;
using detail::fail;
using detail::kUsedHardware;
using detail::load_or_explain;
using detail::loaded_api;
using detail::NvjpegApi;
using detail::status_name;

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

const char* backend_name(unsigned used) {
  static const char* const kNames[8] = {
      "none",    "hardware",         "hybrid",         "hardware+hybrid",
      "default", "hardware+default", "hybrid+default", "hardware+hybrid+default"};
  return kNames[used & 7u];
}

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
