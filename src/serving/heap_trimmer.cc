#include "knnd/serving/heap_trimmer.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace knnd {

int64_t HeapFreeBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.fordblks);
}

absl::Status HeapTrimmer::ValidateOptions(const Options& options) {
  if (options.interval < absl::ZeroDuration() ||
      options.interval > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heap_trim_interval_ms=",
        absl::ToInt64Milliseconds(options.interval),
        " is out of range [0, 3600000] (0 turns trimming off)"));
  }
  if (options.min_free_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("heap_trim_min_free_bytes=",
                     options.min_free_bytes, " is below 4096 (one page)"));
  }
  return absl::OkStatus();
}

void HeapTrimmer::Start() {
  if (options_.interval <= absl::ZeroDuration() || thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void HeapTrimmer::Stop() {
  if (!thread_.joinable()) return;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  thread_.join();
}

int64_t HeapTrimmer::TrimIfWorthIt() {
  const int64_t free_bytes = HeapFreeBytes();
  if (free_bytes < options_.min_free_bytes) return 0;
  malloc_trim(0);
  absl::MutexLock lock(&mu_);
  ++trims_;
  trimmed_free_bytes_ += free_bytes;
  return free_bytes;
}

int64_t HeapTrimmer::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

int64_t HeapTrimmer::trimmed_free_bytes() const {
  absl::MutexLock lock(&mu_);
  return trimmed_free_bytes_;
}

void HeapTrimmer::Run() {
  while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
    if (const int64_t free_bytes = TrimIfWorthIt(); free_bytes > 0) {
      spdlog::debug("heap trim: {:.1f} MiB were free in malloc's arenas",
                    static_cast<double>(free_bytes) / (1 << 20));
    }
  }
}

}  // namespace knnd
