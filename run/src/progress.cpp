// The progress line.
#include "tandem/run/progress.h"

#include <unistd.h>

#include <cstdio>

namespace tandem::run {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && isatty(STDERR_FILENO)),
      start_(Clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
  std::fprintf(stderr, "\r%s step %lld/%lld  %.1f steps/s  ETA %.1f s   ", label_.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), rate, eta);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r%*s\r", 79, "");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace tandem::run
