// Names for tandem's threads, as the system shows them (top -H, gdb, perf) and as a profile's
// summary of CUDA API calls names them: a stage's lane thread, a loader worker. A registry keeps
// each named thread's two ids — the kernel's thread id and its pthread_t value — because a
// profiler may report either.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

/// Names the calling thread (the system keeps the first 15 characters) and records its ids.
void name_this_thread(const std::string& name);

/// The name a thread gave itself through name_this_thread, looked up by its kernel thread id or
/// its pthread_t value (whole, or its low 32 bits); empty for a thread tandem did not name.
std::string named_thread(uint64_t id);

}  // namespace tandem
