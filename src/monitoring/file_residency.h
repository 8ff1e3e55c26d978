// FileResidency: how many bytes of one file this process has memory-mapped,
// and how many of those are resident in the page cache right now (mincore).
// For knnd that file is the index: its inverted lists are served from the
// mapping, so residency says how much of the index a search can touch
// without a disk read, and how much the kernel has reclaimed under pressure.
//
// Cost is bounded: each Take() checks at most max_scan_bytes_per_sample of
// the mapping with mincore, resuming where the previous one stopped, and the
// rest of the mapping keeps the count of its last check. A mapping up to that
// size is therefore exact at every Take(); a larger one is fully refreshed
// every ceil(size / max_scan_bytes_per_sample) calls, and until its first
// full pass the chunks not yet checked count as not resident.
//
// Mappings are found by path in <proc_root>/self/maps, so a file renamed
// over the tracked path ("... (deleted)" in maps) no longer counts.
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_MONITORING_FILE_RESIDENCY_H_
#define KNND_MONITORING_FILE_RESIDENCY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"

namespace knnd {

class FileResidency {
 public:
  struct Options {
    std::string proc_root = "/proc";
    // mincore work per Take(), in bytes of mapping, rounded up to whole
    // 16 MiB chunks. Default 1 GiB: 262,144 pages of 4 KiB.
    int64_t max_scan_bytes_per_sample = int64_t{1} << 30;
  };

  // Whole pages: a mapping's last page counts in full.
  struct Sample {
    int64_t mapped_bytes = 0;
    int64_t resident_bytes = 0;
  };

  explicit FileResidency(const Options& options) : options_(options) {}

  // From now on, samples measure the file at `path` (made absolute and free
  // of symlinks, as maps shows it). Error when the path does not resolve;
  // nothing is tracked then.
  absl::Status Track(const std::string& path);

  // nullopt while nothing is tracked.
  absl::optional<Sample> Take();

 private:
  struct Mapping {
    uintptr_t start = 0;
    uintptr_t end = 0;
    // Resident pages per chunk of the mapping, as of its last check.
    std::vector<int64_t> chunk_resident_pages;
  };

  std::vector<Mapping> ReadMappings(const std::string& path) const;
  void Scan(Mapping* mapping, size_t chunk) const;

  const Options options_;
  absl::Mutex mu_;
  absl::optional<std::string> path_ ABSL_GUARDED_BY(mu_);
  std::vector<Mapping> mappings_ ABSL_GUARDED_BY(mu_);
  size_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;  // over all mappings' chunks
};

}  // namespace knnd

#endif  // KNND_MONITORING_FILE_RESIDENCY_H_
