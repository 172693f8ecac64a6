// The calling thread and the scheduler: see thread_sched.h.
#include "tandem/detail/thread_sched.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem {

ThreadUsage this_thread_usage() {
  ThreadUsage u;
  rusage r{};
  if (getrusage(RUSAGE_THREAD, &r) != 0) return u;
  u.cpu_seconds = static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
                  static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
  u.preemptions = static_cast<int64_t>(r.ru_nivcsw);
  return u;
}

ThreadUsage operator-(const ThreadUsage& later, const ThreadUsage& earlier) {
  return {later.cpu_seconds - earlier.cpu_seconds, later.preemptions - earlier.preemptions};
}

std::string lower_this_thread_priority(int nice) {
  nice = std::clamp(nice, 0, kMaxNice);
  // On Linux a thread's nice value is its own: PRIO_PROCESS with the thread's kernel id sets
  // that thread alone (POSIX would have it set the whole process).
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return std::strerror(errno);
  if (now >= nice) return "";
  if (setpriority(PRIO_PROCESS, tid, nice) != 0) return std::strerror(errno);
  return "";
}

}  // namespace tandem
