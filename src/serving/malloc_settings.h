// glibc malloc settings that keep freed request memory from staying
// resident (config "Memory" block). Process-wide; best applied before
// threads start.
#ifndef KNND_SERVING_MALLOC_SETTINGS_H_
#define KNND_SERVING_MALLOC_SETTINGS_H_

#include <cstdint>

namespace knnd {

struct MallocSettings {
  // M_ARENA_MAX; 0: glibc's default.
  int arena_max = 2;
  // M_MMAP_THRESHOLD; 0: glibc's dynamic one.
  int64_t mmap_threshold_bytes = 1 << 20;
  // M_TOP_PAD; 0: glibc's default (128 KiB).
  int64_t top_pad_bytes = 2 << 20;
};

// Applies `settings` (a failed mallopt is logged, not fatal), sets the trim
// threshold to the mmap threshold, and sizes FAISS's coarse-search block to
// stay under it (faiss/faiss_runtime.h).
void ApplyMallocSettings(const MallocSettings& settings);

}  // namespace knnd

#endif  // KNND_SERVING_MALLOC_SETTINGS_H_
