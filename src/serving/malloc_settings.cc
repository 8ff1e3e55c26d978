#include "knnd/serving/malloc_settings.h"

#include <malloc.h>

#include "knnd/faiss/faiss_runtime.h"
#include "spdlog/spdlog.h"

namespace knnd {

void ApplyMallocSettings(const MallocSettings& settings) {
  if (settings.arena_max > 0 && mallopt(M_ARENA_MAX, settings.arena_max) != 1) {
    spdlog::warn("mallopt(M_ARENA_MAX, {}) failed", settings.arena_max);
  }
  const int64_t mmap_threshold = settings.mmap_threshold_bytes;
  if (mmap_threshold > 0) {
    if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) {
      spdlog::warn("mallopt(M_MMAP_THRESHOLD, {}) failed", mmap_threshold);
    }
    // A fixed mmap threshold also freezes the trim threshold at 128 KiB: the
    // top of the heap was given back and faulted in again on nearly every
    // 256-row request (~95 page faults each). At the mmap threshold, an
    // arena keeps at most that much free at its top (twice it, glibc's own
    // ratio, left anonymous memory 1.5 MiB higher after a burst;
    // bench/RESULTS.md "Page faults").
    if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) {
      spdlog::warn("mallopt(M_TRIM_THRESHOLD, {}) failed", mmap_threshold);
    }
  }
  // What a trim leaves at an arena's top (and a growth adds): with glibc's
  // 128 KiB, the 1 MiB trim threshold still gave back, and faulted in
  // again, the top under each large request's buffers (the request's bytes
  // on gRPC's thread, a slice's look-up tables on a worker); the heap
  // trimmer gives the pad back once knnd is idle.
  if (settings.top_pad_bytes > 0 &&
      mallopt(M_TOP_PAD, static_cast<int>(settings.top_pad_bytes)) != 1) {
    spdlog::warn("mallopt(M_TOP_PAD, {}) failed", settings.top_pad_bytes);
  }
  // The coarse search's distance block then stays on the heap instead of
  // being mapped and faulted in on every call (0 leaves FAISS's default).
  SetCoarseBlockRowsUnder(mmap_threshold);
}

}  // namespace knnd
