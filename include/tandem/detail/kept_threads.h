// KeptThreads: the process's long-lived threads for work that tunes itself per thread — a
// pipeline's stages, a training run's evaluation — reused by role from one run to the next.
//
// Why: ATen keeps per host thread what it learns on a thread's first steps. cuDNN's autotuned
// convolution plans (the v8+ API's benchmark cache is thread_local: execution plans are not
// thread-safe across engines), cuBLAS's handles and workspaces, cuDNN's handles. A pipeline that
// started fresh threads for every run re-tuned every convolution of the model on every run: each
// Trainer fit, each of mode auto's trials, each evaluation after a run's last epoch paid it
// again (seconds for a depthwise-convolution family). A thread kept for its role — the train
// stage's, a feed stage's by name, the evaluation's — tunes once per process.
//
//   role "train":        [run 1's train stage][run 2's][trial 3's] ...   one thread, one plan cache
//   role "stage augment": [run 1's augment]   [run 2's]  ...
//
// A role's thread runs one task at a time. A task given while every thread of its role is busy
// (a nested pipeline, two runs at once) gets another thread of that role, kept too: a role has as
// many threads as it ever had tasks at once. Each task starts from a fresh thread's
// thread-local LibTorch state (grad mode, autocast, ...), whatever the one before left.
#pragma once

#include <functional>
#include <future>
#include <string>

namespace tandem::detail {

/// Starts `task` on an idle kept thread of `role` (made when none is idle), named `thread_name`
/// while it runs, and returns at once; the future is ready when the task has returned and holds
/// what it threw. Thread-safe. The threads live until the process ends.
std::future<void> start_on_kept_thread(const std::string& role, const std::string& thread_name,
                                       std::function<void()> task);

/// Runs `task` on a kept thread of `role`, named `thread_name` (on another thread), and waits for
/// it, rethrowing what it throws: on the calling thread itself when that is a kept thread of
/// `role` (a second thread of the role would tune again what this one has), else as
/// start_on_kept_thread. Either way the task starts from a fresh thread's thread-local LibTorch
/// state, and the caller's is restored afterwards.
void run_on_kept_thread(const std::string& role, const std::string& thread_name,
                        const std::function<void()>& task);

/// How many kept threads `role` has (for tests and reports).
int kept_threads_of(const std::string& role);

/// The role of a pipeline's stage thread: the last stage (where the training step runs) and a
/// serial pipeline's one thread are "train" whatever their name, so the training step's
/// convolutions are tuned once for every mode; any other stage is "stage NAME".
std::string stage_role(const std::string& stage_name, bool last_stage);

}  // namespace tandem::detail
