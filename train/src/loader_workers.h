// The loader threads a train run takes: the count asked, or 0 for every front end's rule
// (distributed::default_loader_workers), for the job builders (job_util.h) and the Trainer.
#pragma once

#include <c10/core/Device.h>

#include "tandem/distributed/launch_env.h"
#include "tandem/error.h"

namespace tandem::train {

inline int loader_workers(int asked, const c10::Device& device) {
  TANDEM_CHECK_ARG(asked >= 0, "worker count ", asked,
                   " is not valid: expected >= 1 loader threads (0: by device)");
  return asked > 0 ? asked : distributed::default_loader_workers(device);
}

}  // namespace tandem::train
