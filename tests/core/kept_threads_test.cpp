// Kept threads: a role's tasks run on the same thread one run after another (what it tuned
// stays), concurrent tasks of a role get threads of their own, each task starts from a fresh
// thread-local state, and what a task throws reaches its caller. The pipeline runs its stages
// on them: the same thread for a stage's role in every run and every mode.
#include "tandem/detail/kept_threads.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "pipeline.h"
#include "tandem/detail/batch.h"
#include "test_support.h"

namespace tandem {
namespace {

using detail::kept_threads_of;
using detail::stage_role;
using detail::start_on_kept_thread;

std::thread::id thread_of(const std::string& role) {
  std::thread::id id;
  start_on_kept_thread(role, "test", [&] { id = std::this_thread::get_id(); }).get();
  return id;
}

TEST(KeptThreadsTest, ARolesTasksOneAfterAnotherRunOnOneThread) {
  const std::thread::id first = thread_of("test one after another");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(thread_of("test one after another"), first) << i;
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(kept_threads_of("test one after another"), 1);
  EXPECT_NE(thread_of("test another role"), first);
}

TEST(KeptThreadsTest, TasksOfOneRoleAtOnceGetThreadsOfTheirOwnKeptForLater) {
  std::mutex m;
  std::condition_variable cv;
  int started = 0;
  std::thread::id a, b;
  auto task = [&](std::thread::id* id) {
    return [&, id] {
      *id = std::this_thread::get_id();
      std::unique_lock<std::mutex> lock(m);
      ++started;
      cv.notify_all();
      cv.wait(lock, [&] { return started == 2; });  // both at once, or neither ends
    };
  };
  auto fa = start_on_kept_thread("test at once", "a", task(&a));
  auto fb = start_on_kept_thread("test at once", "b", task(&b));
  fa.get();
  fb.get();
  EXPECT_NE(a, b);
  EXPECT_EQ(kept_threads_of("test at once"), 2);
  const std::thread::id later = thread_of("test at once");
  EXPECT_TRUE(later == a || later == b);  // a kept one, not a third
  EXPECT_EQ(kept_threads_of("test at once"), 2);
}

TEST(KeptThreadsTest, EachTaskStartsFromAFreshThreadsState) {
  bool grad = false, autocast = true;
  start_on_kept_thread("test state", "t", [] {
    at::GradMode::set_enabled(false);  // left so, as a careless task would
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }).get();
  start_on_kept_thread("test state", "t", [&] {
    grad = at::GradMode::is_enabled();
    autocast = at::autocast::is_autocast_enabled(at::kCPU);
  }).get();
  EXPECT_EQ(kept_threads_of("test state"), 1);
  EXPECT_TRUE(grad);
  EXPECT_FALSE(autocast);
}

TEST(KeptThreadsTest, WhatATaskThrowsReachesItsCaller) {
  auto done = start_on_kept_thread("test throws", "t", [] { throw std::runtime_error("boom"); });
  try {
    done.get();
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_NE(thread_of("test throws"), std::this_thread::get_id());  // the thread lives on
  EXPECT_EQ(kept_threads_of("test throws"), 1);
}

TEST(KeptThreadsTest, ARunFromTheRolesOwnThreadRunsThereFreshAndGivesItsStateBack) {
  using detail::run_on_kept_thread;
  const std::thread::id kept = thread_of("test run");
  std::thread::id outside, inside;
  bool inner_grad = false, outer_grad_after = true;
  run_on_kept_thread("test run", "t", [&] { outside = std::this_thread::get_id(); });
  EXPECT_EQ(outside, kept);  // from another thread: on the role's thread, waited for
  start_on_kept_thread("test run", "t", [&] {
    at::GradMode::set_enabled(false);  // the caller's state, which the inner run must not see
    run_on_kept_thread("test run", "inner", [&] {
      inside = std::this_thread::get_id();
      inner_grad = at::GradMode::is_enabled();
      at::GradMode::set_enabled(false);
    });
    outer_grad_after = at::GradMode::is_enabled();
    at::GradMode::set_enabled(true);
  }).get();
  EXPECT_EQ(inside, kept);  // inline: no second thread of the role
  EXPECT_EQ(kept_threads_of("test run"), 1);
  EXPECT_TRUE(inner_grad);         // a fresh thread's state
  EXPECT_FALSE(outer_grad_after);  // the caller's, given back
  EXPECT_THROW(run_on_kept_thread("test run", "t", [] { throw std::runtime_error("boom"); }),
               std::runtime_error);
}

// A forked child has none of its parent's threads: its tasks get threads of its own (a child
// that waited for its parent's would hang; the alarm ends such a child).
TEST(KeptThreadsTest, AForkedChildStartsThreadsOfItsOwn) {
  const std::thread::id parent = thread_of("test fork");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);
    // (Its thread's id may equal the parent's: glibc reuses the stack of a thread the child
    // does not have.) One thread, and the task ran: the child did not wait for the parent's.
    ::_exit(kept_threads_of("test fork") == 0 &&
                    thread_of("test fork") != std::this_thread::get_id() &&
                    kept_threads_of("test fork") == 1
                ? 0
                : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(thread_of("test fork"), parent);  // the parent's thread lives on
}

TEST(KeptThreadsTest, StageRoles) {
  EXPECT_EQ(stage_role("train", true), "train");
  EXPECT_EQ(stage_role("step", true), "train");
  EXPECT_EQ(stage_role("augment", false), "stage augment");
}

// Each stage of a pipeline runs on its role's kept thread: the same thread in every run, and
// the last stage on the train role's in both modes.
TEST(KeptThreadsTest, APipelinesStagesRunOnTheirRolesThreadsInEveryRun) {
  const c10::Device cpu(c10::kCPU);
  std::mutex m;
  auto run = [&](PipelineMode mode) {
    std::map<std::string, std::thread::id> seen;
    auto stage = [&](const std::string& name) {
      return Stage{name, Lane::create(name, cpu), [&, name](Batch&, const Lane&) {
                     std::lock_guard<std::mutex> lock(m);
                     seen[name] = std::this_thread::get_id();
                   }};
    };
    Pipeline p({stage("kept-load"), stage("kept-feed"), stage("kept-last")}, mode,
               Lane::create("serial", cpu));
    p.run(3);
    return seen;
  };
  const auto first = run(PipelineMode::kPipelined);
  const auto second = run(PipelineMode::kPipelined);
  EXPECT_EQ(first, second);
  EXPECT_NE(first.at("kept-load"), first.at("kept-feed"));
  EXPECT_EQ(first.at("kept-last"), thread_of("train"));
  const auto serial = run(PipelineMode::kSerial);
  for (const auto& [name, id] : serial) EXPECT_EQ(id, first.at("kept-last")) << name;
}

}  // namespace
}  // namespace tandem
