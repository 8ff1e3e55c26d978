// Byte units for logs and messages.
#ifndef KNND_BASE_UNITS_H_
#define KNND_BASE_UNITS_H_

#include <cstdint>

namespace knnd {

constexpr int64_t kMiB = int64_t{1} << 20;

// Bytes as (fractional) MiB, for "%.1f MiB" in messages.
inline double MiB(int64_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(kMiB);
}

}  // namespace knnd

#endif  // KNND_BASE_UNITS_H_
