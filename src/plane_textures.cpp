// The cache of texture objects over uint8 image batches (plane_textures.h).
#include "plane_textures.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "tandem/error.h"

namespace tandem {

namespace {

// Texture objects are never destroyed: a graph that captured a launch keeps its handle, and
// nothing tells the cache when that graph is gone. The cap bounds what a process can leak (a
// texture object is a small descriptor; the memory it reads is the caller's); past it, launches
// stage the source window instead, which computes the same values.
constexpr size_t kMaxCachedTextures = 1024;

// The texture limits the batch must meet, from the device's properties.
struct Limits {
  int64_t pitch_alignment, base_alignment, max_width, max_height, max_pitch;
};

Limits limits_of(const cudaDeviceProp& p) {
  return {static_cast<int64_t>(p.texturePitchAlignment), static_cast<int64_t>(p.textureAlignment),
          p.maxTexture2DLinear[0], p.maxTexture2DLinear[1], p.maxTexture2DLinear[2]};
}

// (device, base address, rows, width)
using Key = std::tuple<int, uintptr_t, int64_t, int64_t>;

struct Cache {
  std::mutex mutex;
  std::map<Key, cudaTextureObject_t> textures;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: outlives static graphs and the CUDA context
  return *c;
}

// Creating a texture object enqueues nothing, but a graph capture in the default (global) mode
// rejects API calls it does not know to be safe; relaxed mode, for this thread and this call
// only, admits it (as PyTorch's allocator does for cudaMalloc during a capture).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

cudaTextureObject_t create(const uint8_t* base, int64_t rows, int64_t width) {
  const RelaxedCaptureMode relaxed;
  cudaResourceDesc resource{};
  resource.resType = cudaResourceTypePitch2D;
  resource.res.pitch2D.devPtr = const_cast<uint8_t*>(base);
  resource.res.pitch2D.desc = cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindUnsigned);
  resource.res.pitch2D.width = static_cast<size_t>(width);
  resource.res.pitch2D.height = static_cast<size_t>(rows);
  resource.res.pitch2D.pitchInBytes = static_cast<size_t>(width);
  cudaTextureDesc texture{};
  texture.addressMode[0] = texture.addressMode[1] = cudaAddressModeClamp;
  texture.filterMode = cudaFilterModePoint;        // gathers ignore it; no filtering wanted
  texture.readMode = cudaReadModeNormalizedFloat;  // v / 255: augment_math::unit_byte
  texture.normalizedCoords = 0;
  cudaTextureObject_t handle = 0;
  TANDEM_CUDA_CHECK(cudaCreateTextureObject(&handle, &resource, &texture, nullptr));
  return handle;
}

}  // namespace

std::string plane_textures(const cudaDeviceProp& device_properties, const uint8_t* images,
                           int64_t batch, int64_t channels, int64_t height, int64_t width,
                           PlaneTextures& out) {
  out = PlaneTextures{};
  if (batch == 0) return "";  // nothing to read, nothing launched
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  const Limits lim = limits_of(device_properties);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::ostringstream why;
  if (channels != kGatherChannels) {
    why << "texture gathers read " << kGatherChannels << " channels; got " << channels;
    return why.str();
  }
  const int64_t sample_rows = channels * height, sample_bytes = sample_rows * width;
  if (width % lim.pitch_alignment != 0 || width > lim.max_width || width > lim.max_pitch) {
    why << "image width " << width << " is not a texture pitch (a multiple of "
        << lim.pitch_alignment << ", at most " << std::min(lim.max_width, lim.max_pitch) << ")";
    return why.str();
  }
  if (reinterpret_cast<uintptr_t>(images) % static_cast<uintptr_t>(lim.base_alignment) != 0) {
    why << "image data at " << static_cast<const void*>(images) << " is not aligned to "
        << lim.base_alignment << " bytes";
    return why.str();
  }
  if ((height * width) % lim.base_alignment != 0) {
    why << "a channel plane of " << height << "x" << width << " bytes does not start its own "
        << "texture: not a multiple of the texture alignment (" << lim.base_alignment << " bytes)";
    return why.str();
  }
  // Samples per texture: as many as its rows allow, fewer while the next texture's base would
  // be off the alignment.
  int64_t per = lim.max_height / sample_rows;
  while (per > 0 && per < batch && (per * sample_bytes) % lim.base_alignment != 0) --per;
  if (per == 0) {
    why << "a sample's " << sample_rows << " rows (channels x height) exceed a texture's "
        << lim.max_height << " or cannot start textures on a " << lim.base_alignment
        << "-byte boundary";
    return why.str();
  }
  per = std::min(per, batch);
  const int64_t count = (batch + per - 1) / per;
  if (count > kMaxPlaneTextures) {
    why << "a batch of " << batch << " needs " << count << " textures of " << per
        << " samples; a launch takes at most " << kMaxPlaneTextures;
    return why.str();
  }
  PlaneTextures t;
  t.count = static_cast<int>(count);
  t.samples_per_texture = static_cast<int>(per);
  for (int64_t k = 0; k < count; ++k)
    for (int64_t ch = 0; ch < channels; ++ch) {
      // Channel ch's plane of the group's first sample, through the group's last sample's.
      const uint8_t* base = images + k * per * sample_bytes + ch * height * width;
      const int64_t rows = std::min(per, batch - k * per) * sample_rows - ch * height;
      const Key key{device, reinterpret_cast<uintptr_t>(base), rows, width};
      auto found = c.textures.find(key);
      if (found == c.textures.end()) {
        if (c.textures.size() >= kMaxCachedTextures) {
          why << "the texture cache is full (" << kMaxCachedTextures << " textures)";
          return why.str();
        }
        found = c.textures.emplace(key, create(base, rows, width)).first;
      }
      t.handles[k][ch] = found->second;
    }
  out = t;
  return "";
}

}  // namespace tandem
