// The registry of reference workloads: the one place that knows them by name.
#include "tandem/workloads/registry.h"

#include <ATen/ATen.h>

#include "tandem/error.h"
#include "tandem/mode.h"
#include "tandem/workloads/cls.h"
#ifdef TANDEM_HAVE_IMAGES
#include "tandem/workloads/images.h"
#endif
#include "tandem/workloads/mlp.h"
#include "tandem/workloads/seg.h"

namespace tandem {

const std::vector<WorkloadEntry>& reference_workloads() {
  static const std::vector<WorkloadEntry> entries{seg_entry(), cls_entry(), mlp_entry()
#ifdef TANDEM_HAVE_IMAGES
                                                                                ,
                                                  images_entry()
#endif
  };
  return entries;
}

std::vector<std::string> reference_workload_names() {
  std::vector<std::string> names;
  for (const auto& e : reference_workloads()) names.push_back(e.name);
  return names;
}

const WorkloadEntry& find_reference_workload(const std::string& name) {
  for (const auto& e : reference_workloads())
    if (e.name == name) return e;
  throw InvalidArgument("workload '" + name + "' is not known: expected " +
                        join_choices(reference_workload_names()));
}

}  // namespace tandem
