// The data-parallel job this Python process belongs to (job_bindings.cpp): joined once, by the
// first tandem.Trainer run under torchrun, and left at interpreter exit.
#pragma once

#include <memory>

#include "tandem/distributed/process_group.h"

namespace tandem::python {

/// The joined job's process group, or nullptr (one process, or not joined yet).
std::shared_ptr<distributed::ProcessGroup> current_job();

/// After a failed run on this rank (an exception, Ctrl-C) or an uncaught Python exception: drops
/// the job without finishing it, so that the group, once its last user lets go, leaves at once
/// and the other ranks see this one stop (within the heartbeat's 10 s) instead of waiting for it
/// at the exit. The process cannot join again. Takes no GIL (callable from a run's thread).
void abandon_job();

}  // namespace tandem::python
