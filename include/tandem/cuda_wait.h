// How this process's host threads wait for a GPU's work: the scheduling policy of the device's
// primary context. CUDA's own choice (auto) spins wherever a process has fewer contexts than the
// machine has cores — on a training host, always — so a thread waiting on an event or a stream
// holds its core the whole time. Beside a loader whose decode workers fill every core, such a
// spinner is taken off its core for whole time slices (thread_sched.h), and the JPEG engines'
// feed thread, which waits in nvJPEG's calls many times a batch, is one. Blocking waits sleep on
// a primitive instead and wake when the work is done: they leave the cores to the workers and
// the scheduler favours a thread that wakes, at the price of a wake-up per wait.
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace tandem {

enum class CudaWait {
  kAuto,   ///< CUDA's choice: spin while the process has fewer contexts than cores, else yield
  kSpin,   ///< spin on the core until the work is done
  kYield,  ///< spin, yielding the core to other threads between polls
  kBlock,  ///< sleep on a synchronization primitive until the work is done
};

/// "auto", "spin", "yield" or "block".
const char* cuda_wait_name(CudaWait wait);

/// Every policy's name, in that order (a CLI's choices).
std::vector<std::string> cuda_wait_names();

/// Parses one of those names; throws InvalidArgument naming the bad value and the valid ones.
CudaWait parse_cuda_wait(const std::string& name);

/// From now on this process's threads wait for `device`'s work as `wait` says (its primary
/// context's flags, through cudaSetDeviceFlags; the other flags are kept). It applies to a
/// context already in use, so it may be called at any time; nothing for a CPU device. Throws
/// CudaError with CUDA's reason where CUDA refuses.
void set_cuda_wait(c10::Device device, CudaWait wait);

/// How this process's threads wait for `device`'s work now (cudaGetDeviceFlags); kAuto for a
/// CPU device.
CudaWait cuda_wait_of(c10::Device device);

}  // namespace tandem
