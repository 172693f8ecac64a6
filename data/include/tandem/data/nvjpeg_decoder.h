// JPEG decode on the GPU through nvJPEG, which is loaded at run time (dlopen) rather than linked:
// a machine without libnvjpeg, or without a GPU, still runs tandem and falls back to the CPU
// decoder (decode.h). Output follows decode.h's convention: (C, H, W) uint8, C = 1 or 3.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// cudaStream_t exactly as CUDA's driver_types.h declares it, so this header does not need the
// CUDA include path (a repeated identical typedef is legal C++).
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace tandem::data {

/// A JPEG held in host memory: `size` bytes at `data` (not owned), and a name (usually its path)
/// used only in error messages.
struct EncodedImage {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string name;
};

/// Images decoded on the GPU, packed back to back in one buffer: sample b is
/// packed[offsets[b] : offsets[b] + C*H*W], laid out (C, H, W) with (C, H, W) = sizes[b].
struct PackedImages {
  at::Tensor packed;   // (N,) uint8 on the decoder's device, N = sum of C*H*W
  at::Tensor offsets;  // (B,) int64 on the device: where each sample starts in `packed`
  at::Tensor sizes;    // (B, 3) int64 on the device: each sample's (C, H, W)
  // The same on the host: known from the JPEG headers before any pixel is decoded, so reading
  // them never waits for the GPU.
  std::vector<int64_t> offsets_host;
  std::vector<std::array<int64_t, 3>> sizes_host;

  int64_t size() const { return static_cast<int64_t>(offsets_host.size()); }
  /// Sample b as a (C, H, W) view into `packed` (no copy).
  at::Tensor image(int64_t b) const;
};

/// Which nvJPEG path decodes: what NvjpegDecoder::open() is asked to prefer.
enum class NvjpegBackend {
  /// The GPU's hardware JPEG engines (NVJPEG_BACKEND_HARDWARE: A100, A30, H100, H200...) for
  /// every image they support (baseline, single scan, not 4:1:0 / 4:1:1); the rest of a batch
  /// through the GPU_HYBRID backend when more than 50 of them remain, else the default
  /// backend. Without the engines, the same minus the hardware. The environment variable
  /// TANDEM_NVJPEG_BACKEND (auto, hardware, hybrid or default) overrides kAuto alone.
  kAuto,
  /// As kAuto, but open() fails (nullptr, `why_not` saying why) without the hardware engines.
  kHardware,
  /// Never the engines: NVJPEG_BACKEND_GPU_HYBRID batched decode, whose Huffman decode runs on
  /// the GPU for baseline JPEGs in batches of more than 50 (on the host for smaller ones).
  kHybrid,
  /// The default backend alone: Huffman decode on the host, in the calling thread.
  kDefault,
};

/// How long a decode()'s caller keeps the images' bytes readable, which decides whether the
/// hardware engines read them where they are or from a copy of the decoder's own.
enum class HostBytes {
  /// Freed once decode() returns: the engines' images are first copied into pinned staging
  /// buffers of the decoder's (a memcpy of the whole batch on the caller's thread).
  kUntilReturn,
  /// Page-locked, and kept readable until the work decode() queued on its stream completes (a
  /// block of LibTorch's pinned host allocator with an event recorded on that stream after
  /// the call, as decode_on_device does): read in place, no copy.
  kPinnedUntilStreamDone,
};

/// A GPU JPEG decoder on one device: nvJPEG library handles, decode states and staging buffers,
/// reused across calls (their device and pinned buffers grow to the largest batch seen, then
/// stay; a batched decode is re-initialised only when its batch size or output format changes).
///
/// Not thread-safe: a decoder is used by one thread at a time (nvJPEG's decode state is per
/// thread); a loader gives each worker its own. Neither copied nor moved: held by unique_ptr.
///
///   host bytes ──(headers checked on the host)──► hardware JPEG engines, or Huffman decode on
///   the GPU (hybrid) or on the host (default) ──► [stream] IDCT, color conversion ──► packed
///   (the caller's later work on `stream` sees the pixels; other streams must wait on an event
///   recorded on `stream` after decode())
class NvjpegDecoder {
 public:
  /// Whether open() can succeed here, without creating a decoder: tandem was built with
  /// nvjpeg.h, CUDA sees a device, and libnvjpeg loads with every function tandem uses.
  /// When not, returns false and sets `*why_not` (if given) to a one-line reason.
  static bool available(std::string* why_not = nullptr);

  /// A decoder on CUDA device `device`, or nullptr with `*why_not` (if given) set to a one-line
  /// reason when CUDA has no device, tandem was built without nvjpeg.h, libnvjpeg cannot be
  /// loaded or initialised, or `prefer` is kHardware and the device has no JPEG engines.
  /// Throws tandem::InvalidArgument for a negative device or one past the last (when devices
  /// exist), or a TANDEM_NVJPEG_BACKEND that names no backend.
  static std::unique_ptr<NvjpegDecoder> open(int device, std::string* why_not = nullptr,
                                             NvjpegBackend prefer = NvjpegBackend::kAuto);

  ~NvjpegDecoder();
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  /// Decodes the JPEGs to RGB (channels 3) or gray (channels 1), planar (C, H, W), into one
  /// packed buffer. Runs on `stream` (nullptr: the device's default stream); returns once the
  /// GPU work is queued, not done. The output is allocated from LibTorch's caching allocator on
  /// `stream` (the stream owns the block), so the caller may free it on that stream without
  /// syncing. The host bytes are consumed during the call and may be freed once it returns,
  /// unless `bytes` says the caller keeps them (HostBytes).
  ///
  /// Gray JPEGs become 3 equal channels when channels == 3; color JPEGs become their Y (BT.601
  /// luma) plane when channels == 1, as decode_image does. Pixels match decode_image's within
  /// rounding (a different IDCT and chroma upsampling), not bit for bit.
  ///
  /// Throws tandem::InvalidArgument for channels not 1 or 3, and tandem::Error naming the
  /// image's `name` and the cause, in one line, for an empty, non-JPEG (a PNG included),
  /// truncated, corrupt or unsupported (e.g. CMYK / YCCK: decode_image reads those) input, or
  /// one of more than kMaxImagePixels pixels. Those checks read the headers on the host before
  /// any GPU work; damage inside the entropy-coded data that leaves the headers and the
  /// end-of-image marker intact may decode to wrong pixels on the hardware engines (which
  /// report no per-image errors) rather than throw. Not capture-safe (host work, allocation).
  PackedImages decode(const std::vector<EncodedImage>& images, int64_t channels,
                      cudaStream_t stream, HostBytes bytes = HostBytes::kUntilReturn);

  /// Which nvJPEG path produced the pixels of the last decode() of a non-empty batch:
  /// "hardware" (the JPEG engines), "hybrid" (GPU_HYBRID: Huffman decode on the GPU) or
  /// "default" (Huffman decode on the host); several joined by '+' (in that order) when the
  /// batch was split, e.g. "hardware+default" for a progressive JPEG among baseline ones;
  /// "none" before the first. A static string.
  const char* backend() const;

  /// Whether this decoder uses the hardware JPEG engines where it can.
  bool has_hardware() const;

  /// The batch the hardware engines hold device memory for: up to `rows` images of up to
  /// `side` x `side` pixels. It grows with the batches they decode (never shrinks), so that
  /// nvJPEG does not free and allocate device memory between batches of photos of different
  /// sizes; {0, 0} before their first batch, without the engines, or where nvJPEG cannot
  /// reserve (nvjpegDecodeBatchedPreAllocate).
  struct EngineRoom {
    int rows = 0;
    int side = 0;
  };
  EngineRoom engine_room() const;

  int device() const { return device_; }

 private:
  struct State;  // nvJPEG handles, states and staging (nvjpeg_state.h)
  NvjpegDecoder(int device, std::unique_ptr<State> state);

  int device_;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::data
