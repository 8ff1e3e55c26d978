// int64 arithmetic that sticks at the int64 limits instead of wrapping: the
// one way every memory estimate (the daemon's EstimateSearchBytes, the
// front's ShardFrontEstimate, the budgets) combines values a caller or a
// shard chose (k, queries, refine_factor, nprobe, payload sizes). Wrapped,
// k = 2^31 - 1 times refine_factor = 2^32 - 1 became a small or negative
// estimate that the admission gate took, and a negative one lowered the
// bytes it counts in flight; saturated, it stays above every budget, and
// an estimate that reached kSaturated is refused by name (Saturated()).
//
// Thread-safety: pure functions.
#ifndef KNND_BASE_SATURATING_H_
#define KNND_BASE_SATURATING_H_

#include <cstdint>
#include <limits>

namespace knnd {

inline constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max();

// a + b, clamped to [int64 min, int64 max].
constexpr int64_t SatAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? kSaturated : std::numeric_limits<int64_t>::min();
}

// a - b, clamped likewise.
constexpr int64_t SatSub(int64_t a, int64_t b) {
  int64_t difference = 0;
  if (!__builtin_sub_overflow(a, b, &difference)) return difference;
  return b < 0 ? kSaturated : std::numeric_limits<int64_t>::min();
}

// a * b, clamped likewise.
constexpr int64_t SatMul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (!__builtin_mul_overflow(a, b, &product)) return product;
  return (a < 0) == (b < 0) ? kSaturated : std::numeric_limits<int64_t>::min();
}

// The product of three or more factors, clamped at every step.
template <typename... Rest>
constexpr int64_t SatMul(int64_t a, int64_t b, int64_t c, Rest... rest) {
  return SatMul(SatMul(a, b), c, static_cast<int64_t>(rest)...);
}

// Whether an estimate reached the limit: some factor was out of all
// proportion, and the estimate says nothing but "too large".
constexpr bool Saturated(int64_t bytes) { return bytes >= kSaturated; }

}  // namespace knnd

#endif  // KNND_BASE_SATURATING_H_
