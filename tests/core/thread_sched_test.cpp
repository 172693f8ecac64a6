// The calling thread and the scheduler: CPU time accrues while the thread computes and not while
// it sleeps; a thread lowers its own priority alone, never raises it, and the bounds hold.
#include "tandem/detail/thread_sched.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace tandem {
namespace {

int nice_of_this_thread() {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  EXPECT_EQ(errno, 0);
  return nice;
}

TEST(ThreadSchedTest, CpuTimeAccruesWhileComputingNotWhileAsleep) {
  const auto busy_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  const ThreadUsage start = this_thread_usage();
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < busy_until) sink = sink + 1;
  const ThreadUsage computed = this_thread_usage() - start;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const ThreadUsage slept = this_thread_usage() - start - computed;
  EXPECT_GT(computed.cpu_seconds, 0);
  EXPECT_LT(slept.cpu_seconds, computed.cpu_seconds) << "asleep, the thread uses no core";
  EXPECT_GE(computed.preemptions, 0);
  EXPECT_GE(slept.preemptions, 0);
}

TEST(ThreadSchedTest, AThreadLowersItsOwnPriorityAloneAndNeverRaisesIt) {
  const int caller = nice_of_this_thread();
  int after_lowering = -1, after_asking_less = -1, after_too_low = -1;
  std::string said_lowering = "?", said_less = "?", said_too_low = "?";
  std::thread([&] {
    said_lowering = lower_this_thread_priority(caller + 5 > kMaxNice ? kMaxNice : caller + 5);
    after_lowering = nice_of_this_thread();
    said_less = lower_this_thread_priority(0);  // already lower: left alone
    after_asking_less = nice_of_this_thread();
    said_too_low = lower_this_thread_priority(kMaxNice + 30);  // clamped to the bound
    after_too_low = nice_of_this_thread();
  }).join();
  EXPECT_EQ(said_lowering, "");
  EXPECT_EQ(after_lowering, caller + 5 > kMaxNice ? kMaxNice : caller + 5);
  EXPECT_EQ(said_less, "");
  EXPECT_EQ(after_asking_less, after_lowering) << "a lower nice value is not taken back";
  EXPECT_EQ(said_too_low, "");
  EXPECT_EQ(after_too_low, kMaxNice);
  EXPECT_EQ(nice_of_this_thread(), caller) << "the other threads keep their priority";
}

}  // namespace
}  // namespace tandem
