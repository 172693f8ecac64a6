// Shared helpers of the cuDNN fusion probe: error checks, the clock, bf16 conversion, ResNet-50's shape
// tables and the buffer fills.
#include "common.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

namespace fusion_probe {

void cuda_check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        throw CudaFailure(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
}

void fe_check(fe::error_t status, const char* stage) {
    if (status.is_bad()) {
        throw StepFailure(std::string(stage) + ": " + status.get_message());
    }
}

double now_s() {
    static const auto start = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                       // round to nearest even
    return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

std::string first_line(const std::string& s, size_t max_chars) {
    std::string out = s.substr(0, s.find('\n'));
    if (out.size() > max_chars) out = out.substr(0, max_chars - 3) + "...";
    return out;
}

const std::vector<ConvShape> kShapes = {
    {"conv1x1 64->64 @56", 256, 64, 64, 56, 56, 1, 1, 0},
    {"conv3x3 64->64 @56", 256, 64, 64, 56, 56, 3, 3, 1},
    {"conv1x1 64->256 @56", 256, 64, 256, 56, 56, 1, 1, 0},
    {"conv1x1 256->64 @56", 256, 256, 64, 56, 56, 1, 1, 0},
    {"conv3x3 128->128 @28", 256, 128, 128, 28, 28, 3, 3, 1},
    {"conv1x1 512->128 @28", 256, 512, 128, 28, 28, 1, 1, 0},
    {"conv1x1 128->512 @28", 256, 128, 512, 28, 28, 1, 1, 0},
    {"conv3x3 256->256 @14", 256, 256, 256, 14, 14, 3, 3, 1},
    {"conv1x1 1024->256 @14", 256, 1024, 256, 14, 14, 1, 1, 0},
    {"conv3x3 512->512 @7", 256, 512, 512, 7, 7, 3, 3, 1},
    {"conv1x1 512->2048 @7", 256, 512, 2048, 7, 7, 1, 1, 0},
};

const std::vector<FinalizeShape> kFinalizeShapes = {
    {64, 256 * 56 * 56},  {128, 256 * 28 * 28}, {256, 256 * 56 * 56},
    {512, 256 * 28 * 28}, {1024, 256 * 14 * 14}, {2048, 256 * 7 * 7},
};

// Fills a device buffer of bf16 values by repeating a host block of uniform values in [lo, hi).
void fill_bf16(void* dev, size_t elems, float lo, float hi, uint32_t seed) {
    const size_t block = std::min<size_t>(elems, size_t(1) << 22);
    std::vector<uint16_t> host(block);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (auto& v : host) v = to_bf16(dist(rng));
    for (size_t off = 0; off < elems; off += block) {
        size_t n = std::min(block, elems - off);
        CUDA_OK(cudaMemcpy(static_cast<uint16_t*>(dev) + off, host.data(), n * 2, cudaMemcpyHostToDevice));
    }
}

void fill_f32(float* dev, size_t elems, float lo, float hi, uint32_t seed) {
    std::vector<float> host(elems);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (auto& v : host) v = dist(rng);
    CUDA_OK(cudaMemcpy(dev, host.data(), elems * 4, cudaMemcpyHostToDevice));
}

}  // namespace fusion_probe
