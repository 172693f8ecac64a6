// nvJPEG's entry points (a table typed from the real nvjpeg.h with decltype: a wrong signature
// fails to compile rather than corrupting the stack), their loading, status names and handles.
#pragma once

#include <nvjpeg.h>  // only where TANDEM_HAVE_NVJPEG_H is set (data/CMakeLists.txt)

#include <string>

namespace tandem::data::detail {

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

// Loaded once per process (thread-safe static initialisation).
const LoadedApi& loaded_api();

// Whether the library loaded with every required entry point; if not, why (in `why_not`).
bool load_or_explain(std::string* why_not);

std::string status_name(nvjpegStatus_t status);

// A failed decode of one image, as the one-line cause that follows the image's name.
std::string decode_failure(const char* call, nvjpegStatus_t status);

// nvjpegCreateEx with strict bitstream checking where the library knows the flag (a corrupt
// stream is an error, not a picture); an older library that rejects it gets the default.
// Its own cudaMalloc / cudaHostAlloc allocators: its buffers grow only to the largest batch,
// so their synchronising frees are rare, and the caching allocator's stream semantics would
// not know which stream nvJPEG last used a buffer on.
nvjpegStatus_t create_handle(const NvjpegApi& api, nvjpegBackend_t backend, unsigned flags,
                             nvjpegHandle_t* handle);

}  // namespace tandem::data::detail
