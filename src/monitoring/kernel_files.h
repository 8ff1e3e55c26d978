// Reading the small text files the kernel exposes under /proc and /sys
// (/proc/self/status, memory.stat ...). They are generated on read, so they
// are read whole, once, per sample. Thread-safety: pure functions.
#ifndef KNND_MONITORING_KERNEL_FILES_H_
#define KNND_MONITORING_KERNEL_FILES_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/optional.h"

namespace knnd {

// The file's content, or nullopt when it cannot be opened or read.
absl::optional<std::string> ReadKernelFile(const std::string& path);

// The number on the line that starts with `key` followed by ':' or blanks, as
// in "RssAnon:\t  1234 kB" (status) or "anon 4096" (memory.stat). A "kB"
// unit is converted to bytes. nullopt when the key is absent or the value is
// not a number.
absl::optional<int64_t> FindKeyedNumber(absl::string_view content,
                                        absl::string_view key);

}  // namespace knnd

#endif  // KNND_MONITORING_KERNEL_FILES_H_
