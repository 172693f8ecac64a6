// tandem._C.Dataset: a tandem dataset as Python holds it, shared with the loaders and the
// runs (tandem.Trainer) that read it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/loader.h"

struct PyDataset {
  std::shared_ptr<const tandem::Dataset> dataset;
  int64_t size() const { return dataset->size(); }
  std::vector<std::string> fields() const {
    std::vector<std::string> out;
    for (const auto& f : dataset->fields()) out.push_back(f.name);
    return out;
  }
};
