// Error types and checks shared by the whole library: CUDA runtime calls, loader failures, stage
// failures and bad user input surface as exceptions derived from tandem::Error, each carrying a
// one-line, human-readable cause. (Broken internal invariants are TORCH_CHECKs, LibTorch's
// c10::Error, and so is whatever a stage's own torch call throws inside it — the runner wraps
// those in a RunError naming the stage.)
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

/// The base of every exception tandem throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime call failed; what() names the call, its error string and file:line.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// A loader worker failed to produce a sample; what() names the sample index and the cause.
class LoaderError : public Error {
 public:
  using Error::Error;
};

/// Input from a user of the library or CLI was invalid; what() names the value and what was
/// expected. The CLI turns this into one line on stderr and exit code 2.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The first line of `text`: error messages are reported as one line (LibTorch's carry a
/// backtrace after it).
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

namespace detail {
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace tandem

/// Evaluates a cudaError_t-returning expression once and throws tandem::CudaError on failure.
#define TANDEM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const auto tandem_cuda_status_ = (expr);                                                     \
    if (tandem_cuda_status_ != 0)                                                                \
      ::tandem::detail::throw_cuda_error(static_cast<int>(tandem_cuda_status_), #expr, __FILE__, \
                                         __LINE__);                                              \
  } while (0)

/// Throws tandem::InvalidArgument with a streamed message when `cond` is false.
#define TANDEM_CHECK_ARG(cond, ...)                                                      \
  do {                                                                                   \
    if (!(cond)) throw ::tandem::InvalidArgument(::tandem::detail::concat(__VA_ARGS__)); \
  } while (0)

#include <sstream>
namespace tandem::detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
/// "1 sample", "3 samples": a count and its noun for messages (`noun` singular; "s" added).
inline std::string count_of(long long n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}
}  // namespace tandem::detail
