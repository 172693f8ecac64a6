// What the system's scheduler does with the calling thread: how much of a core it has had, how
// often it was taken off one, and a lower priority for a thread whose work can wait. A loader's
// decode workers fill every core on a busy host, and a thread that waits on the GPU in short
// spins (the JPEG engines' feed, the step's launches) then loses its core for whole time slices.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

/// The calling thread's use of the cores since it started (getrusage RUSAGE_THREAD): its CPU
/// time (user + system) and its involuntary context switches — the times the scheduler took the
/// core away while the thread could still run. Zeros where the system does not say.
struct ThreadUsage {
  double cpu_seconds = 0;
  int64_t preemptions = 0;
};
ThreadUsage this_thread_usage();
/// `later` minus `earlier`, field by field.
ThreadUsage operator-(const ThreadUsage& later, const ThreadUsage& earlier);

/// The highest nice value a thread may take (the lowest priority).
constexpr int kMaxNice = 19;

/// Runs the calling thread at nice `nice` (0..kMaxNice; the process's other threads keep
/// theirs) where that is lower than its priority now, so that the scheduler gives the others
/// the cores first whenever all are busy. Lowering one's own priority needs no privilege. An
/// empty string when done (or nothing to do), else the system's reason.
std::string lower_this_thread_priority(int nice);

}  // namespace tandem
