// The per-channel normalization check both image transforms make (augment.h's AugmentSpec,
// resized_crop.h's ResizedCropSpec): a supported channel count, one mean and one non-zero std
// per channel.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/error.h"

namespace tandem::detail {

/// Throws InvalidArgument naming the first bad value.
inline void check_normalization(int64_t channels, int64_t max_channels,
                                const std::vector<double>& mean, const std::vector<double>& std) {
  TANDEM_CHECK_ARG(channels >= 1 && channels <= max_channels, "channel count ", channels,
                   " is not valid: expected 1..", max_channels);
  TANDEM_CHECK_ARG(static_cast<int64_t>(mean.size()) == channels, "mean has ", mean.size(),
                   " values for ", channels, " channels");
  TANDEM_CHECK_ARG(static_cast<int64_t>(std.size()) == channels, "std has ", std.size(),
                   " values for ", channels, " channels");
  for (size_t c = 0; c < std.size(); ++c)
    TANDEM_CHECK_ARG(std[c] != 0.0, "std[", c, "] is 0: expected a non-zero value");
}

}  // namespace tandem::detail
