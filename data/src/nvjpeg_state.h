// One NvjpegDecoder's nvJPEG handles, decode states and staging buffers (its State), and the
// decode paths on them: the hardware engines', GPU_HYBRID's and the default backend's.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nvjpeg.h>  // only where TANDEM_HAVE_NVJPEG_H is set (data/CMakeLists.txt)

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvjpeg_api.h"
#include "tandem/data/nvjpeg_decoder.h"

namespace tandem::data {

namespace detail {

// The paths a decode() used, as bits in the order backend() names them.
constexpr unsigned kUsedHardware = 1, kUsedHybrid = 2, kUsedDefault = 4;

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

}  // namespace detail

// The nvJPEG handles and decode states of one decoder: the default backend's (image headers,
// batched decode, and single-image decode to name a bad file), the hardware engines' (when the
// device has them and they are wanted) and GPU_HYBRID's (created on first use). Handles are
// bound to the device current when they are created, so every call below runs under a guard
// for the decoder's device.
struct NvjpegDecoder::State {
  const detail::NvjpegApi* api = nullptr;
  NvjpegBackend prefer = NvjpegBackend::kAuto;

  nvjpegHandle_t handle = nullptr;     // default backend
  detail::Batched batched;             // its nvjpegDecodeBatched state
  nvjpegJpegState_t single = nullptr;  // its nvjpegDecode state, for the per-image fallback

  nvjpegHandle_t hw_handle = nullptr;  // hardware engines; null when not in use
  detail::Batched hw;
  nvjpegJpegStream_t hw_stream = nullptr;  // one image's parsed headers: is it supported?
  std::array<detail::Staging, 2> staging;
  int next_staging = 0;
  NvjpegDecoder::EngineRoom room;  // what the engines' state holds device memory for
  bool room_refused = false;       // nvJPEG refused a reservation: never asked again
  // Output formats the engines refused to initialise a batch for (bit 1: Y, bit 2: RGB): not
  // a property of any image, so those go straight to the other backends from then on.
  unsigned hw_refused_formats = 0;
  unsigned hw_decoded_formats = 0;  // formats the engines have decoded a batch to

  nvjpegHandle_t hybrid_handle = nullptr;  // GPU_HYBRID; null until used, or when it failed
  detail::Batched hybrid;
  bool hybrid_tried = false;
  std::string hybrid_error;

  unsigned last_used = 0;  // backend()'s bits for the last non-empty batch
  // Recorded after each decode's work on its stream; the next decode waits for it, so at most
  // one batch is in flight in the decode states and buffers this decoder reuses (the pipeline
  // runs ahead of the device: in a graphed mode the next batch's decode was issued while the
  // last one's was still in flight, and the losses went non-finite).
  cudaEvent_t previous_done = nullptr;
  bool previous_pending = false;
  // Where the decodes' outputs are allocated (see NvjpegDecoder::decode(), step 2); from the
  // device's pool on first use.
  std::optional<c10::cuda::CUDAStream> output_stream;
  detail::Gathered hw_batch, rest_batch;
  std::vector<uint8_t> on_hardware;

  ~State();

  // The hardware engines' handle, state, header stream and staging events, or false with `why`.
  bool open_hardware(std::string* why);
  void release_hardware();

  // GPU_HYBRID's handle and batched state, created on first use; false (with `why`, if given)
  // when that failed, then and on every later call.
  bool ensure_hybrid(std::string* why);

  static unsigned format_bit(nvjpegOutputFormat_t format) {
    return format == NVJPEG_OUTPUT_Y ? 1u : 2u;
  }

  // Whether the hardware engines take this JPEG (baseline, one scan, a subsampling they know)
  // to `format`.
  bool hardware_supports(const uint8_t* p, size_t n, nvjpegOutputFormat_t format);
  // The same for the image whose header hw_stream holds (read_header's).
  bool hardware_supports_parsed(nvjpegOutputFormat_t format);

  // An image's header read once, by the engines' parse into hw_stream, which then answers both
  // what nvjpegGetImageInfo would (sizes, components, subsampling) and whether the engines take
  // it: the engines' thread read every header twice before, 4-6 ms a batch of photos during
  // which the engines sat idle. False (nothing read) without the engines or the stream's
  // getters, or where the parse fails: the caller then asks nvjpegGetImageInfo, whose status
  // names what is wrong.
  bool read_header(const uint8_t* p, size_t n, int* components,
                   nvjpegChromaSubsampling_t* subsampling, int64_t* height, int64_t* width);

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
  void reserve_hardware(int rows, int64_t height, int64_t width);

  // The images `which` on the hardware engines, their bitstreams read in place where the caller
  // keeps them pinned until the stream's work is done (`in_place`), else staged in pinned
  // memory; false when nvJPEG refused the batch (nothing thrown: the caller decodes them
  // another way).
  bool decode_hardware(const std::vector<EncodedImage>& images, const std::vector<size_t>& which,
                       const std::vector<nvjpegImage_t>& destinations, nvjpegOutputFormat_t format,
                       cudaStream_t stream, bool in_place);

  // The staging buffer to copy the next `total` bytes into, once the decode that last read it
  // is done, grown when too small; nullptr where pinned memory could not be had (the engines
  // then read the caller's bytes, which stay valid for the call).
  detail::Staging* next_staging_buffer(size_t total);

  // One batch on the engines; remembers the output formats they refused or decoded.
  bool run_engines(detail::Gathered& g, nvjpegOutputFormat_t format, cudaStream_t stream);

  // The images `which` (in batch order) without the engines: GPU_HYBRID's batched decode for a
  // batch it runs on the GPU (or always, when preferred), else the default backend's; a batch
  // either refuses is decoded again image by image with nvjpegDecode, and the first image that
  // fails there is the one the error names (a failed batch names none). Rewriting slots in
  // stream order is safe: the later write wins. Returns the backend bit that decoded.
  unsigned decode_rest(const std::vector<EncodedImage>& images, const std::vector<size_t>& which,
                       const std::vector<nvjpegImage_t>& destinations, nvjpegOutputFormat_t format,
                       cudaStream_t stream);
};

}  // namespace tandem::data
