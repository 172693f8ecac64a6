// Helpers that several test files share, defined once: the test sources compile in batches
// (tests/CMakeLists.txt), where two files' own copies would collide.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace tandem::test_support {

inline const c10::Device kCpu(c10::kCPU);
inline const c10::Device kCuda(c10::kCUDA, 0);

/// Whether `text` contains `part` (for messages).
inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace tandem::test_support
