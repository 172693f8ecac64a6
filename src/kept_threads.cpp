// KeptThreads: a registry of long-lived threads by role, each running one task at a time from a
// fresh thread-local state. Written by hand: a thread pool would hand a task to any thread, but
// what is kept here (a thread's autotuned plans) belongs to the thread that ran the role before.
#include "tandem/detail/kept_threads.h"

#include <ATen/ThreadLocalState.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/detail/thread_name.h"

namespace tandem::detail {

namespace {

// The kept thread this is (its role and its fresh state), for run_on_kept_thread; unset on any
// other thread.
thread_local const std::string* t_role = nullptr;
thread_local const at::ThreadLocalState* t_fresh = nullptr;

class KeptThread {
 public:
  explicit KeptThread(std::string role) : role_(std::move(role)), thread_([this] { loop(); }) {
    thread_.detach();  // lives as long as the process: the registry is never destroyed
  }

  /// Hands the thread its next task; the caller has marked it busy.
  void give(std::function<void()> task, std::promise<void> done) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
      done_ = std::move(done);
      has_task_ = true;
    }
    wake_.notify_one();
  }

  bool busy = false;  // guarded by the registry's mutex: set by the giver, cleared when done

 private:
  void loop();

  const std::string role_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> task_;
  std::promise<void> done_;
  bool has_task_ = false;
  std::thread thread_;  // last: started once the rest is built
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::vector<std::unique_ptr<KeptThread>>> by_role;
};

// Never destroyed: a kept thread may be running or waiting when the process exits, and static
// destruction must not pull its state away.
std::atomic<Registry*> g_registry{nullptr};

// A forked child has none of its parent's threads (and maybe a registry locked at the fork): it
// starts an empty registry of its own, leaving the parent's as it was.
void forget_threads_in_child() { g_registry.store(new Registry); }

Registry& registry() {
  static Registry* first = [] {
    auto* r = new Registry;
    g_registry.store(r);
    pthread_atfork(nullptr, nullptr, forget_threads_in_child);
    return r;
  }();
  (void)first;
  return *g_registry.load();
}

void KeptThread::loop() {
  // This thread's state as a new thread has it; every task starts from it.
  const at::ThreadLocalState fresh;
  t_role = &role_;
  t_fresh = &fresh;
  for (;;) {
    std::function<void()> task;
    std::promise<void> done;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return has_task_; });
      task = std::move(task_);
      done = std::move(done_);
      has_task_ = false;
    }
    std::exception_ptr error;
    try {
      const at::ThreadLocalStateGuard state(fresh);
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // what the task held goes before its caller is told it is done
    {
      // Idle before the future is ready: a caller that starts the role's next task as soon as
      // this one is done finds this thread, with what it has tuned, and not a new one.
      std::lock_guard<std::mutex> lock(registry().mutex);
      busy = false;
    }
    if (error)
      done.set_exception(error);
    else
      done.set_value();
  }
}

}  // namespace

std::future<void> start_on_kept_thread(const std::string& role, const std::string& thread_name,
                                       std::function<void()> task) {
  std::promise<void> promise;
  std::future<void> done = promise.get_future();
  Registry& r = registry();
  KeptThread* chosen = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto& threads = r.by_role[role];
    for (auto& t : threads)
      if (!t->busy) {
        chosen = t.get();
        break;
      }
    if (!chosen) {
      threads.push_back(std::make_unique<KeptThread>(role));
      chosen = threads.back().get();
    }
    chosen->busy = true;
  }
  // Named for each task: a profile's summary of API calls names the thread by its stage.
  chosen->give(
      [name = thread_name, task = std::move(task)] {
        name_this_thread(name);
        task();
      },
      std::move(promise));
  return done;
}

void run_on_kept_thread(const std::string& role, const std::string& thread_name,
                        const std::function<void()>& task) {
  if (t_role && *t_role == role) {
    const at::ThreadLocalStateGuard state(*t_fresh);  // the caller's state comes back after
    task();
    return;
  }
  start_on_kept_thread(role, thread_name, task).get();
}

int kept_threads_of(const std::string& role) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_role.find(role);
  return it == r.by_role.end() ? 0 : static_cast<int>(it->second.size());
}

std::string stage_role(const std::string& stage_name, bool last_stage) {
  return last_stage ? std::string("train") : "stage " + stage_name;
}

}  // namespace tandem::detail
