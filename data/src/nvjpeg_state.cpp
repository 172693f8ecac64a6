// The State's decode paths (nvjpeg_state.h): the hardware engines' batched decode with its
// staging, and GPU_HYBRID's and the default backend's for the images the engines do not take.
#if TANDEM_HAVE_NVJPEG_H  // else compiled out, as the decoder is (nvjpeg_decoder.cpp)

#include "nvjpeg_state.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "codec_util.h"

namespace tandem::data {

using detail::Batched;
using detail::create_handle;
using detail::decode_failure;
using detail::fail;
using detail::Gathered;
using detail::kUsedDefault;
using detail::kUsedHybrid;
using detail::loaded_api;
using detail::LoadedApi;
using detail::NvjpegApi;
using detail::Staging;
using detail::status_name;

namespace {

// NVJPEG_BACKEND_GPU_HYBRID's batched decode runs the Huffman decode on the GPU only for
// batches larger than 50 (nvjpeg.h); below that it is the default backend's host decode.
constexpr size_t kHybridMinBatch = 51;

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

}  // namespace

NvjpegDecoder::State::~State() {  // statuses ignored: a destructor never throws
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

bool NvjpegDecoder::State::open_hardware(std::string* why) {
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

void NvjpegDecoder::State::release_hardware() {
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

bool NvjpegDecoder::State::ensure_hybrid(std::string* why) {
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

bool NvjpegDecoder::State::hardware_supports(const uint8_t* p, size_t n,
                                             nvjpegOutputFormat_t format) {
  if (hw_handle == nullptr || (hw_refused_formats & format_bit(format)) != 0) return false;
  if (api->stream_parse_header(hw_handle, p, n, hw_stream) != NVJPEG_STATUS_SUCCESS) return false;
  return hardware_supports_parsed(format);
}

bool NvjpegDecoder::State::hardware_supports_parsed(nvjpegOutputFormat_t format) {
  if ((hw_refused_formats & format_bit(format)) != 0) return false;
  int is_supported = -1;  // 0 means supported (nvjpeg.h)
  return api->batched_supported(hw_handle, hw_stream, &is_supported) == NVJPEG_STATUS_SUCCESS &&
         is_supported == 0;
}

bool NvjpegDecoder::State::read_header(const uint8_t* p, size_t n, int* components,
                                       nvjpegChromaSubsampling_t* subsampling, int64_t* height,
                                       int64_t* width) {
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

void NvjpegDecoder::State::reserve_hardware(int rows, int64_t height, int64_t width) {
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

bool NvjpegDecoder::State::decode_hardware(const std::vector<EncodedImage>& images,
                                           const std::vector<size_t>& which,
                                           const std::vector<nvjpegImage_t>& destinations,
                                           nvjpegOutputFormat_t format, cudaStream_t stream,
                                           bool in_place) {
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

Staging* NvjpegDecoder::State::next_staging_buffer(size_t total) {
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

bool NvjpegDecoder::State::run_engines(Gathered& g, nvjpegOutputFormat_t format,
                                       cudaStream_t stream) {
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

unsigned NvjpegDecoder::State::decode_rest(const std::vector<EncodedImage>& images,
                                           const std::vector<size_t>& which,
                                           const std::vector<nvjpegImage_t>& destinations,
                                           nvjpegOutputFormat_t format, cudaStream_t stream) {
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

}  // namespace tandem::data

#endif  // TANDEM_HAVE_NVJPEG_H
