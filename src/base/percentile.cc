#include "knnd/base/percentile.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace knnd {

double Percentile(std::vector<double>& samples, double p) {
  if (samples.empty()) return 0;
  const double clamped = std::clamp(p, 0.0, 1.0);
  const size_t n = samples.size();
  // Nearest rank: ceil(p * n), 1-based, at least 1.
  size_t rank = static_cast<size_t>(std::ceil(clamped * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  auto nth = samples.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(samples.begin(), nth, samples.end());
  return *nth;
}

}  // namespace knnd
