// nvJPEG through dlopen: the library is resolved at run time into a table of function pointers
// typed from the real nvjpeg.h (decltype), so a wrong signature fails to compile rather than
// corrupting the stack, and a machine without libnvjpeg still loads libtandem_data. Where
// nvjpeg.h was not found at configure time (TANDEM_HAVE_NVJPEG_H unset) the decoder is compiled
// out and open() says so.
#include "tandem/data/nvjpeg_decoder.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <utility>

#include "codec_util.h"
#include "tandem/data/decode.h"
#include "tandem/error.h"

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

std::unique_ptr<NvjpegDecoder> NvjpegDecoder::open(int device, std::string* why_not) {
  TANDEM_CHECK_ARG(device >= 0, "NvjpegDecoder::open: device ", device,
                   " is negative; expected a CUDA device index >= 0");
  if (why_not) *why_not = kNoHeader;
  return nullptr;
}

NvjpegDecoder::NvjpegDecoder(int device, std::unique_ptr<State> state)
    : device_(device), state_(std::move(state)) {}
NvjpegDecoder::~NvjpegDecoder() = default;

PackedImages NvjpegDecoder::decode(const std::vector<EncodedImage>&, int64_t, cudaStream_t) {
  throw Error(kNoHeader);  // unreachable: open() never returns a decoder in this build
}

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
};

struct LoadedApi {
  NvjpegApi api;
  std::string error;  // empty when every entry point resolved
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
  return loaded;
}

// Loaded once per process (thread-safe static initialisation).
const LoadedApi& loaded_api() {
  static const LoadedApi loaded = load_api();
  return loaded;
}

std::string status_name(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS: return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG: return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "nvjpegStatus_t " + std::to_string(static_cast<int>(status));
}

// A failed decode of one image, as the one-line cause that follows the image's name.
std::string decode_failure(const char* call, nvjpegStatus_t status) {
  const std::string where = std::string(" (") + call + ": " + status_name(status) + ")";
  switch (status) {
    case NVJPEG_STATUS_BAD_JPEG:
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "corrupt or truncated JPEG" + where;
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "JPEG kind not supported by nvJPEG (decode_image may read it)" + where;
    default: return "nvJPEG failed to decode it" + where;
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

// What a walk over the marker segments after SOI finds, without decoding anything.
struct JpegMarkers {
  int components = 0;     // Nf of the frame header (SOFn); 0 when none was reached
  size_t first_scan = 0;  // offset of the first SOS marker; 0 when the headers end before it
};

// Junk between segments is skipped up to the next 0xFF, as libjpeg does (with a warning).
JpegMarkers walk_markers(const uint8_t* p, size_t n) {
  JpegMarkers found;
  size_t pos = 2;  // after SOI (FF D8), which the caller has sniffed
  while (pos + 1 < n) {
    if (p[pos] != 0xFF) {
      ++pos;
      continue;
    }
    const uint8_t marker = p[pos + 1];
    if (marker == 0xFF || marker == 0x00) {  // a fill byte, or a stray 0xFF in junk
      ++pos;
      continue;
    }
    if (marker == 0xDA) {
      found.first_scan = pos;
      return found;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9)) {  // no length field
      pos += 2;
      continue;
    }
    // SOF0..SOF15 but DHT (C4), JPG (C8), DAC (CC): FF Cn, length(2), P, Y(2), X(2), Nf.
    const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                       marker != 0xCC;
    if (frame && pos + 9 < n) found.components = p[pos + 9];
    if (pos + 3 >= n) return found;
    pos += 2 + ((static_cast<size_t>(p[pos + 2]) << 8) | p[pos + 3]);
  }
  return found;
}

// Whether an EOI marker (FF D9) follows the first scan. Entropy-coded data byte-stuffs every
// 0xFF (FF 00), so FF D9 there is a real marker; an EXIF thumbnail's EOI lies before the scan.
// nvJPEG, like libjpeg, decodes a file cut short inside its scan data without an error (the
// missing blocks come out flat), so this is how a truncated file becomes an error, as it is
// in decode_image.
bool has_end_after_scan(const uint8_t* p, size_t n, size_t scan) {
  if (scan == 0) return false;
  for (size_t i = n - 1; i > scan + 1; --i)  // EOI is almost always the last two bytes
    if (p[i] == 0xD9 && p[i - 1] == 0xFF) return true;
  return false;
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

}  // namespace

// The nvJPEG handle and the two decode states of one decoder. Handles are bound to the device
// current when they are created, so every call below runs under a guard for device_.
struct NvjpegDecoder::State {
  const NvjpegApi* api = nullptr;
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t batched = nullptr;  // nvjpegDecodeBatched's state
  nvjpegJpegState_t single = nullptr;   // nvjpegDecode's, for the per-image fallback
  // What nvjpegDecodeBatchedInitialize was last called with; re-initialised when either
  // changes, and after a failed batch (nvJPEG requires it to reset the state).
  bool batched_ready = false;
  int batch_size = 0;
  nvjpegOutputFormat_t format = NVJPEG_OUTPUT_RGB;

  ~State() {  // statuses ignored: a destructor never throws
    if (single) api->state_destroy(single);
    if (batched) api->state_destroy(batched);
    if (handle) api->destroy(handle);
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

std::unique_ptr<NvjpegDecoder> NvjpegDecoder::open(int device, std::string* why_not) {
  TANDEM_CHECK_ARG(device >= 0, "NvjpegDecoder::open: device ", device,
                   " is negative; expected a CUDA device index >= 0");
  if (!available(why_not)) return nullptr;
  const int count = c10::cuda::device_count();
  TANDEM_CHECK_ARG(device < count, "NvjpegDecoder::open: device ", device,
                   " does not exist; this machine has ", count, " CUDA device(s)");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));

  auto state = std::make_unique<State>();
  state->api = &loaded_api().api;
  const NvjpegApi& api = *state->api;
  // The default backend lets nvJPEG pick hybrid (host Huffman) or GPU-assisted Huffman per
  // image. Strict bitstream checking where the library knows the flag: a corrupt stream is an
  // error, not a picture; an older library that rejects the flag gets the default.
  // Its own cudaMalloc / cudaHostAlloc allocators: its buffers grow only to the largest batch,
  // so their synchronising frees are rare, and the caching allocator's stream semantics would
  // not know which stream nvJPEG last used a buffer on.
  nvjpegStatus_t status =
      api.create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_BITSTREAM_STRICT,
                    &state->handle);
  if (status != NVJPEG_STATUS_SUCCESS)
    status = api.create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT,
                           &state->handle);
  if (status != NVJPEG_STATUS_SUCCESS) {
    state->handle = nullptr;
    if (why_not) *why_not = "nvjpegCreateEx failed on cuda:" + std::to_string(device) + ": " +
                            status_name(status);
    return nullptr;
  }
  for (nvjpegJpegState_t* s : {&state->batched, &state->single}) {
    status = api.state_create(state->handle, s);
    if (status != NVJPEG_STATUS_SUCCESS) {
      *s = nullptr;
      if (why_not) *why_not = "nvjpegJpegStateCreate failed: " + status_name(status);
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

PackedImages NvjpegDecoder::decode(const std::vector<EncodedImage>& images, int64_t channels,
                                   cudaStream_t stream) {
  TANDEM_CHECK_ARG(channels == 1 || channels == 3, "NvjpegDecoder::decode: channels ", channels,
                   " not supported; expected 1 (gray) or 3 (RGB)");
  const NvjpegApi& api = *state_->api;
  const size_t batch = images.size();

  // 1. Headers, on the host: validate every image and size its slot before any GPU work, so a
  //    bad file fails the call before anything is queued.
  PackedImages out;
  out.offsets_host.resize(batch);
  out.sizes_host.resize(batch);
  int64_t total = 0;
  for (size_t b = 0; b < batch; ++b) {
    const EncodedImage& im = images[b];
    TANDEM_CHECK_ARG(im.data != nullptr || im.size == 0, "NvjpegDecoder::decode: image ", b,
                     " (", im.name, ") has ", im.size, " bytes at a null pointer");
    if (im.size == 0) fail(im.name, "empty file (0 bytes), not an image");
    const ImageFormat format = sniff_format(im.data, im.size);
    if (format == ImageFormat::kPng)
      fail(im.name, "a PNG, not a JPEG: the GPU decoder reads JPEGs only (decode_image reads "
                    "PNGs)");
    if (format != ImageFormat::kJpeg)
      fail(im.name, "not a JPEG file (it starts with bytes " + first_bytes_hex(im.data, im.size) +
                        ")");
    int components = 0;
    nvjpegChromaSubsampling_t subsampling = NVJPEG_CSS_UNKNOWN;
    int widths[NVJPEG_MAX_COMPONENT] = {0};
    int heights[NVJPEG_MAX_COMPONENT] = {0};
    const JpegMarkers markers = walk_markers(im.data, im.size);
    const nvjpegStatus_t status = api.get_image_info(state_->handle, im.data, im.size,
                                                     &components, &subsampling, widths, heights);
    if (status != NVJPEG_STATUS_SUCCESS && markers.components == 4) components = 4;
    else if (status != NVJPEG_STATUS_SUCCESS)
      fail(im.name, (status == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
                             status == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED
                         ? "JPEG kind not supported by nvJPEG (nvjpegGetImageInfo: "
                         : "corrupt or truncated JPEG header (nvjpegGetImageInfo: ") +
                        status_name(status) + ")");
    if (components == 4)
      fail(im.name, "CMYK / YCCK JPEG (4 components): not supported by the GPU decoder "
                    "(decode_image reads it)");
    if (components != 1 && components != 3)
      fail(im.name, "JPEG with " + std::to_string(components) +
                        " components: not supported by the GPU decoder (expected 1 or 3)");
    if (subsampling == NVJPEG_CSS_UNKNOWN)
      fail(im.name, "JPEG with a chroma subsampling nvJPEG does not support");
    if (!has_end_after_scan(im.data, im.size, markers.first_scan))
      fail(im.name, "corrupt or truncated JPEG (no end-of-image marker after the image data)");
    const int64_t height = heights[0], width = widths[0];  // component 0: full-resolution luma
    detail::check_pixel_count(height, width, im.name);
    out.sizes_host[b] = {channels, height, width};
    out.offsets_host[b] = total;
    total += channels * height * width;
  }

  // 2. Output, allocated on `stream` itself (the caching allocator ties the block to the
  //    stream current at allocation), so freeing it after work queued on `stream` is safe
  //    without recordStream.
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));
  const auto index = static_cast<c10::DeviceIndex>(device_);
  const c10::cuda::CUDAStream lane = stream != nullptr
                                         ? c10::cuda::getStreamFromExternal(stream, index)
                                         : c10::cuda::getDefaultCUDAStream(index);
  c10::cuda::CUDAStreamGuard stream_guard(lane);
  const auto on_device = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, index);
  out.packed = at::empty({total}, on_device);
  {
    // (B,) and (B, 3) int64 through pinned staging: an asynchronous copy on the lane (the
    // caching host allocator keeps the staging block until the copy is done).
    const auto pinned = at::TensorOptions().dtype(at::kLong).pinned_memory(true);
    at::Tensor offsets = at::empty({static_cast<int64_t>(batch)}, pinned);
    at::Tensor sizes = at::empty({static_cast<int64_t>(batch), 3}, pinned);
    std::copy(out.offsets_host.begin(), out.offsets_host.end(), offsets.data_ptr<int64_t>());
    for (size_t b = 0; b < batch; ++b)
      std::copy(out.sizes_host[b].begin(), out.sizes_host[b].end(),
                sizes.data_ptr<int64_t>() + 3 * b);
    out.offsets = offsets.to(on_device.dtype(at::kLong), /*non_blocking=*/true);
    out.sizes = sizes.to(on_device.dtype(at::kLong), /*non_blocking=*/true);
  }
  if (batch == 0) return out;

  // 3. Planar destinations inside `packed`: channel c of sample b is its (H, W) plane at
  //    offsets[b] + c*H*W, pitch W. Planar RGB / Y output writes each plane separately, so the
  //    (C, H, W) layout needs no transpose afterwards.
  const nvjpegOutputFormat_t format = channels == 3 ? NVJPEG_OUTPUT_RGB : NVJPEG_OUTPUT_Y;
  std::vector<nvjpegImage_t> destinations(batch);
  std::vector<const unsigned char*> data(batch);
  std::vector<size_t> lengths(batch);
  uint8_t* base = out.packed.data_ptr<uint8_t>();
  for (size_t b = 0; b < batch; ++b) {
    const auto [c, h, w] = out.sizes_host[b];
    nvjpegImage_t& d = destinations[b];
    d = nvjpegImage_t{};
    for (int64_t k = 0; k < c; ++k) {
      d.channel[k] = base + out.offsets_host[b] + k * h * w;
      d.pitch[k] = static_cast<size_t>(w);
    }
    data[b] = images[b].data;
    lengths[b] = images[b].size;
  }

  // 4. One batched call: nvJPEG spreads the Huffman decode of the whole batch and launches one
  //    set of kernels for it, where per-image calls would launch per image. But a failed batch
  //    names no image, and the batched path rejects some streams the single-image one accepts;
  //    so on failure every image is decoded again on its own with nvjpegDecode, and the first
  //    that fails there is the one the error names. (Rewriting slots in stream order is safe:
  //    the later write wins.) The decoupled API would give per-image errors up front but costs
  //    a parse, a host and a device phase per image, with their own buffers; not worth it while
  //    bad files are rare.
  State& s = *state_;
  if (!s.batched_ready || s.batch_size != static_cast<int>(batch) || s.format != format) {
    const nvjpegStatus_t status = api.batched_initialize(
        s.handle, s.batched, static_cast<int>(batch), /*max_cpu_threads=*/1, format);
    if (status != NVJPEG_STATUS_SUCCESS)
      throw Error("nvjpegDecodeBatchedInitialize failed for a batch of " +
                  std::to_string(batch) + ": " + status_name(status));
    s.batched_ready = true;
    s.batch_size = static_cast<int>(batch);
    s.format = format;
  }
  const nvjpegStatus_t batched = api.decode_batched(s.handle, s.batched, data.data(),
                                                    lengths.data(), destinations.data(), stream);
  if (batched == NVJPEG_STATUS_SUCCESS) return out;

  s.batched_ready = false;  // a failed batch must be re-initialised before the next
  for (size_t b = 0; b < batch; ++b) {
    const nvjpegStatus_t status = api.decode(s.handle, s.single, data[b], lengths[b], format,
                                             &destinations[b], stream);
    if (status != NVJPEG_STATUS_SUCCESS)
      fail(images[b].name, decode_failure("nvjpegDecode", status));
  }
  return out;
}

#endif  // TANDEM_HAVE_NVJPEG_H

}  // namespace tandem::data
