// RandomDataset: uniform random fields from a counter-based generator (sample_rng.h).
#include "tandem/random_dataset.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <limits>
#include <set>

#include "tandem/detail/sample_rng.h"
#include "tandem/error.h"

namespace tandem {

namespace {
bool is_integer(at::ScalarType t) { return t == at::kByte || t == at::kInt || t == at::kLong; }

double lowest(at::ScalarType t) {
  return t == at::kByte  ? 0.0
         : t == at::kInt ? static_cast<double>(std::numeric_limits<int32_t>::min())
                         : static_cast<double>(std::numeric_limits<int64_t>::min());
}
double highest_plus_one(at::ScalarType t) {
  return t == at::kByte  ? 256.0
         : t == at::kInt ? 2147483648.0
                         : static_cast<double>(std::numeric_limits<int64_t>::max());
}

template <typename T>
void fill_integers(SampleRng& rng, T* out, int64_t n, int64_t low, uint32_t span) {
  int64_t chunk[256];
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t m = std::min<int64_t>(256, n - i);
    rng.fill_below(chunk, m, span);
    for (int64_t j = 0; j < m; ++j) out[i + j] = static_cast<T>(low + chunk[j]);
  }
}
}  // namespace

RandomDataset::RandomDataset(std::vector<RandomField> fields, int64_t size, uint64_t seed)
    : fields_(std::move(fields)), size_(size), seed_(seed) {
  TANDEM_CHECK_ARG(size >= 0, "dataset size ", size, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(!fields_.empty(), "a random dataset needs at least one field");
  std::set<std::string> names;
  for (const RandomField& f : fields_) {
    TANDEM_CHECK_ARG(!f.name.empty(), "a random field has no name");
    TANDEM_CHECK_ARG(names.insert(f.name).second, "random field '", f.name,
                     "' is named twice: expected one field per name");
    for (const int64_t d : f.shape)
      TANDEM_CHECK_ARG(d >= 0, "random field '", f.name, "' has dimension ", d,
                       ": expected sizes >= 0");
    TANDEM_CHECK_ARG(is_integer(f.dtype) || f.dtype == at::kFloat, "random field '", f.name,
                     "' has dtype ", c10::toString(f.dtype),
                     ": expected uint8, int32, int64 or float32");
    TANDEM_CHECK_ARG(f.high > f.low, "random field '", f.name, "' has range [", f.low, ", ", f.high,
                     "): expected high > low");
    if (is_integer(f.dtype)) {
      TANDEM_CHECK_ARG(f.low == std::floor(f.low) && f.high == std::floor(f.high), "random field '",
                       f.name, "' has range [", f.low, ", ", f.high,
                       "): expected whole numbers for an integer dtype");
      TANDEM_CHECK_ARG(f.high - f.low <= 4294967296.0, "random field '", f.name, "' spans ",
                       f.high - f.low, " values: expected at most 2^32");
      TANDEM_CHECK_ARG(f.low >= lowest(f.dtype) && f.high <= highest_plus_one(f.dtype),
                       "random field '", f.name, "' has range [", f.low, ", ", f.high,
                       "): outside what ", c10::toString(f.dtype), " holds");
    }
  }
}

std::vector<FieldSpec> RandomDataset::fields() const {
  std::vector<FieldSpec> out;
  for (const RandomField& f : fields_) out.push_back({f.name, f.shape, f.dtype});
  return out;
}

void RandomDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TORCH_CHECK(index >= 0 && index < size_, "sample index ", index, " is outside [0, ", size_, ")");
  SampleRng rng(seed_, static_cast<uint64_t>(index));
  for (size_t i = 0; i < fields_.size(); ++i) {
    const RandomField& f = fields_[i];
    const int64_t n = out.at(i).numel();
    const auto low = static_cast<int64_t>(f.low);
    // 2^32 values wrap to a span of 0 in uint32: fill_below's multiply-shift then gives 0, so
    // that range takes the raw 32 bits instead.
    const double width = f.high - f.low;
    if (f.dtype == at::kByte && f.low == 0 && f.high == 256) {
      rng.fill_bytes(static_cast<uint8_t*>(out[i].data_ptr()), n);  // the common image case
    } else if (f.dtype == at::kFloat) {
      float* p = out[i].data_ptr<float>();
      for (int64_t j = 0; j < n; ++j)  // 24 random bits: every float32 in [0, 1) step 2^-24
        p[j] = static_cast<float>(f.low + width * static_cast<double>(rng.next() >> 40) *
                                              (1.0 / 16777216.0));
    } else if (width == 4294967296.0) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t v = low + static_cast<int64_t>(rng.next() >> 32);
        if (f.dtype == at::kLong)
          out[i].data_ptr<int64_t>()[j] = v;
        else
          out[i].data_ptr<int32_t>()[j] = static_cast<int32_t>(v);
      }
    } else {
      const auto span = static_cast<uint32_t>(width);
      if (f.dtype == at::kByte)
        fill_integers(rng, static_cast<uint8_t*>(out[i].data_ptr()), n, low, span);
      else if (f.dtype == at::kInt)
        fill_integers(rng, out[i].data_ptr<int32_t>(), n, low, span);
      else
        fill_integers(rng, out[i].data_ptr<int64_t>(), n, low, span);
    }
  }
}

}  // namespace tandem
