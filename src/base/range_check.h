// The one shape of a range refusal: INVALID_ARGUMENT "NAME=VALUE is outside
// [LO, HI]", used by every component that checks its options (the config
// check reports the same message, prefixed with "config field ").
#ifndef KNND_BASE_RANGE_CHECK_H_
#define KNND_BASE_RANGE_CHECK_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace knnd {

template <typename T, typename L, typename H>
absl::Status CheckInRange(absl::string_view name, T value, L lo, H hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, "=", value, " is outside [", lo, ", ", hi, "]"));
}

}  // namespace knnd

#endif  // KNND_BASE_RANGE_CHECK_H_
