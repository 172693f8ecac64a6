// CUDA_DEVICE_MAX_CONNECTIONS, asked for and read (hardware_queues.h says when and why).
#include "tandem/hardware_queues.h"

#include <cstdlib>
#include <string>

namespace tandem {
namespace {

constexpr const char* kVariable = "CUDA_DEVICE_MAX_CONNECTIONS";
constexpr int kCudaDefault = 8;  // where the variable names no positive number

}  // namespace

bool ask_for_hardware_queues() {
  if (std::getenv(kVariable) != nullptr) return false;
  return setenv(kVariable, std::to_string(kHardwareQueues).c_str(), /*overwrite=*/0) == 0;
}

int hardware_queues() {
  const char* value = std::getenv(kVariable);
  if (value == nullptr) return kCudaDefault;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  return end != value && *end == '\0' && n > 0 ? static_cast<int>(n) : kCudaDefault;
}

}  // namespace tandem
