// An AugmentSpec from its fields as Python passes them (tandem.AugmentSpec's), checked: for
// torch.ops.tandem.augment (augment_op.cpp) and tandem.Trainer's augment stage.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <c10/util/ArrayRef.h>

#include "tandem/augment.h"

tandem::AugmentSpec augment_spec_from(at::IntArrayRef crop, at::IntArrayRef out,
                                      double max_rotation_deg, int64_t blur_kernel,
                                      double sigma_min, double sigma_max, at::ArrayRef<double> mean,
                                      at::ArrayRef<double> std, double hflip_probability);
