// ProcessMetrics: a Prometheus collector read at scrape time for the memory
// and CPU of the knnd process, as the kernel and Kubernetes account them:
//   process_*                  Prometheus' standard process metrics (/proc)
//   knnd_process_resident_memory_bytes{type}  RSS split into anonymous,
//                              file-backed and shared-memory pages
//   knnd_index_mapped_bytes, knnd_index_page_cache_resident_bytes
//                              the index file's mapping and how much of it
//                              is in the page cache (mincore, bounded cost)
//   knnd_cgroup_memory_*_bytes the container's limit, usage, anonymous and
//                              file bytes (cgroup v2 or v1); no limit series
//                              when the cgroup has none
// Values that cannot be read (no cgroup, not Linux) are left out rather than
// reported as 0.
//
// Thread-safety: Collect() and TrackIndexFile() are safe to call
// concurrently (the exposer may serve several scrapes at once).
#ifndef KNND_MONITORING_PROCESS_METRICS_H_
#define KNND_MONITORING_PROCESS_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "absl/status/status.h"
#include "knnd/monitoring/file_residency.h"

namespace knnd {

class ProcessMetrics : public prometheus::Collectable {
 public:
  struct Options {
    // Where procfs and the cgroup filesystem are mounted; tests point these
    // at fixture directories.
    std::string proc_root = "/proc";
    std::string cgroup_root = "/sys/fs/cgroup";
    // mincore work per scrape for the index residency, in bytes of mapping
    // (see file_residency.h). Default 1 GiB.
    int64_t max_residency_scan_bytes_per_scrape = int64_t{1} << 30;
  };

  explicit ProcessMetrics(const Options& options);

  // The index file whose mapping and residency are reported from now on.
  absl::Status TrackIndexFile(const std::string& path);
  // Likewise for the raw-vectors file of exact re-ranking; an empty path
  // stops reporting it (the index is served without one).
  absl::Status TrackVectorsFile(const std::string& path);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Options options_;
  // Take() advances the bounded mincore scan, so a const Collect() updates it.
  mutable FileResidency residency_;
  mutable FileResidency vectors_residency_;
};

}  // namespace knnd

#endif  // KNND_MONITORING_PROCESS_METRICS_H_
