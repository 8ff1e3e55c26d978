// Reads the memory limit and usage of the cgroup this process runs in, the
// numbers the kernel (and so Kubernetes) acts on: above the limit the kernel
// reclaims page cache first and OOM-kills only when anonymous memory leaves
// nothing to reclaim, so anonymous and file-backed bytes are reported apart.
//
// Both hierarchies are understood:
//   v2 (unified): memory.max, memory.current, memory.stat (anon, file)
//   v1 (memory controller): memory.limit_in_bytes, memory.usage_in_bytes,
//       memory.stat (total_rss, total_cache, hierarchical_memory_limit)
// The process's cgroup comes from <proc_root>/self/cgroup. With a cgroup
// namespace (Kubernetes) that path is "/" and the mount is the pod's own
// cgroup; without one the path is joined under the mount point.
//
// Thread-safety: pure functions of the files they read.
#ifndef KNND_MONITORING_CGROUP_MEMORY_H_
#define KNND_MONITORING_CGROUP_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/types/optional.h"

namespace knnd {

struct CgroupMemory {
  int version = 0;  // 1 or 2
  std::string dir;  // the cgroup directory the values were read from
  // Absent when there is no limit ("max" in v2, the page-rounded INT64_MAX
  // in v1), so that dashboards do not divide by a meaningless huge number.
  absl::optional<int64_t> limit_bytes;
  absl::optional<int64_t> usage_bytes;
  absl::optional<int64_t> anonymous_bytes;
  absl::optional<int64_t> file_bytes;
};

// Returns the memory accounting of this process's cgroup, or nullopt when no
// memory cgroup can be found (not on Linux, cgroupfs not mounted, no memory
// controller). Missing or unreadable files leave their fields absent.
absl::optional<CgroupMemory> ReadCgroupMemory(const std::string& proc_root,
                                              const std::string& cgroup_root);

}  // namespace knnd

#endif  // KNND_MONITORING_CGROUP_MEMORY_H_
