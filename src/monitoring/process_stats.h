// Reads this process's resource usage from procfs, the same sources and
// meanings as Prometheus' standard process collector, plus the split of
// resident memory that matters under a memory limit: anonymous pages (heap,
// never reclaimed) versus file-backed pages (the mmap'd index, page cache the
// kernel can drop and read back).
//
// Thread-safety: pure functions of the files they read.
#ifndef KNND_MONITORING_PROCESS_STATS_H_
#define KNND_MONITORING_PROCESS_STATS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/types/optional.h"

namespace knnd {

// Every field is absent when its source file is missing or malformed.
struct ProcessStats {
  // From <proc_root>/self/stat (and btime in <proc_root>/stat).
  absl::optional<double> cpu_seconds;         // user + system
  absl::optional<double> start_time_seconds;  // since the Unix epoch
  absl::optional<int64_t> virtual_bytes;
  absl::optional<int64_t> resident_bytes;
  // From <proc_root>/self/status: RssAnon + RssFile + RssShmem == VmRSS.
  absl::optional<int64_t> resident_anonymous_bytes;
  absl::optional<int64_t> resident_file_bytes;
  absl::optional<int64_t> resident_shmem_bytes;
  // VmHWM: the highest VmRSS since the process started (what `knnctl
  // build` reports as its peak).
  absl::optional<int64_t> peak_resident_bytes;
  // Entries of <proc_root>/self/fd, and the soft "Max open files" limit from
  // <proc_root>/self/limits (absent when unlimited).
  absl::optional<int64_t> open_fds;
  absl::optional<int64_t> max_fds;
};

// `proc_root` is "/proc" outside tests. Clock ticks and the page size are
// those of the running kernel (sysconf).
ProcessStats ReadProcessStats(const std::string& proc_root);

// CPU seconds (user + system) of each thread of process `pid`
// (<proc_root>/<pid>/task/*/stat), summed by thread name; empty when the
// process is gone. Threads that have ended are not counted.
std::map<std::string, double> ThreadCpuSecondsByName(
    const std::string& proc_root, int pid);

}  // namespace knnd

#endif  // KNND_MONITORING_PROCESS_STATS_H_
