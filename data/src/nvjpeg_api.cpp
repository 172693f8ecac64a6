// nvJPEG loaded at run time with dlopen (a machine without libnvjpeg still loads
// libtandem_data) into nvjpeg_api.h's table, and the names and messages for its statuses.
#if TANDEM_HAVE_NVJPEG_H  // else compiled out, as the decoder is (nvjpeg_decoder.cpp)

#include "nvjpeg_api.h"

#include <dlfcn.h>

#include <string>
#include <vector>

namespace tandem::data::detail {

namespace {

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

}  // namespace

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

nvjpegStatus_t create_handle(const NvjpegApi& api, nvjpegBackend_t backend, unsigned flags,
                             nvjpegHandle_t* handle) {
  nvjpegStatus_t status = api.create_ex(backend, nullptr, nullptr, flags, handle);
  if (status != NVJPEG_STATUS_SUCCESS && flags != NVJPEG_FLAGS_DEFAULT)
    status = api.create_ex(backend, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, handle);
  if (status != NVJPEG_STATUS_SUCCESS) *handle = nullptr;
  return status;
}

}  // namespace tandem::data::detail

#endif  // TANDEM_HAVE_NVJPEG_H
