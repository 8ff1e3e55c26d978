#include "knnd/monitoring/process_metrics.h"

#include <utility>

#include "knnd/monitoring/cgroup_memory.h"
#include "knnd/monitoring/process_stats.h"

namespace knnd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Appends a one-sample family when the value is known.
template <typename T>
void AddGauge(std::vector<MetricFamily>* out, const char* name,
              const char* help, const absl::optional<T>& value) {
  if (!value) return;
  ClientMetric metric;
  metric.gauge.value = static_cast<double>(*value);
  out->push_back(MetricFamily{name, help, MetricType::Gauge, {metric}});
}

FileResidency::Options ResidencyOptions(const ProcessMetrics::Options& o) {
  FileResidency::Options r;
  r.proc_root = o.proc_root;
  r.max_scan_bytes_per_sample = o.max_residency_scan_bytes_per_scrape;
  return r;
}

}  // namespace

ProcessMetrics::ProcessMetrics(const Options& options)
    : options_(options),
      residency_(ResidencyOptions(options)),
      vectors_residency_(ResidencyOptions(options)) {}

absl::Status ProcessMetrics::TrackIndexFile(const std::string& path) {
  return residency_.Track(path);
}

absl::Status ProcessMetrics::TrackVectorsFile(const std::string& path) {
  if (path.empty()) {
    (void)vectors_residency_.Track("");  // fails to resolve: tracks nothing
    return absl::OkStatus();
  }
  return vectors_residency_.Track(path);
}

std::vector<MetricFamily> ProcessMetrics::Collect() const {
  std::vector<MetricFamily> out;
  const ProcessStats p = ReadProcessStats(options_.proc_root);
  if (p.cpu_seconds) {
    ClientMetric metric;
    metric.counter.value = *p.cpu_seconds;
    out.push_back(MetricFamily{"process_cpu_seconds_total",
                               "Total user and system CPU time spent in seconds.",
                               MetricType::Counter, {metric}});
  }
  AddGauge(&out, "process_start_time_seconds",
           "Start time of the process since unix epoch in seconds.",
           p.start_time_seconds);
  AddGauge(&out, "process_virtual_memory_bytes",
           "Virtual memory size in bytes.", p.virtual_bytes);
  AddGauge(&out, "process_resident_memory_bytes",
           "Resident memory size in bytes.", p.resident_bytes);
  AddGauge(&out, "process_open_fds", "Number of open file descriptors.",
           p.open_fds);
  AddGauge(&out, "process_max_fds",
           "Maximum number of open file descriptors.", p.max_fds);

  MetricFamily split{"knnd_process_resident_memory_bytes",
                     "Resident memory of knnd in bytes by page type "
                     "(/proc/self/status RssAnon, RssFile, RssShmem): "
                     "anonymous pages are never reclaimed, file pages (the "
                     "mapped index) can be dropped and read back.",
                     MetricType::Gauge,
                     {}};
  const std::pair<const char*, absl::optional<int64_t>> types[] = {
      {"anonymous", p.resident_anonymous_bytes},
      {"file", p.resident_file_bytes},
      {"shmem", p.resident_shmem_bytes}};
  for (const auto& [type, bytes] : types) {
    if (!bytes) continue;
    ClientMetric metric;
    metric.label = {{"type", type}};
    metric.gauge.value = static_cast<double>(*bytes);
    split.metric.push_back(std::move(metric));
  }
  if (!split.metric.empty()) out.push_back(std::move(split));

  if (absl::optional<FileResidency::Sample> index = residency_.Take()) {
    AddGauge(&out, "knnd_index_mapped_bytes",
             "Bytes of the served index file memory-mapped by knnd.",
             absl::optional<int64_t>(index->mapped_bytes));
    AddGauge(&out, "knnd_index_page_cache_resident_bytes",
             "Bytes of the mapped index file resident in the page cache "
             "(mincore; large files are refreshed over several scrapes).",
             absl::optional<int64_t>(index->resident_bytes));
  }
  if (absl::optional<FileResidency::Sample> vectors =
          vectors_residency_.Take()) {
    AddGauge(&out, "knnd_vectors_mapped_bytes",
             "Bytes of the raw-vectors file (exact re-ranking) memory-mapped "
             "by knnd.",
             absl::optional<int64_t>(vectors->mapped_bytes));
    AddGauge(&out, "knnd_vectors_page_cache_resident_bytes",
             "Bytes of the mapped raw-vectors file resident in the page "
             "cache (mincore; large files are refreshed over several "
             "scrapes).",
             absl::optional<int64_t>(vectors->resident_bytes));
  }

  if (absl::optional<CgroupMemory> cg =
          ReadCgroupMemory(options_.proc_root, options_.cgroup_root)) {
    AddGauge(&out, "knnd_cgroup_memory_limit_bytes",
             "Memory limit of knnd's cgroup in bytes (absent when unlimited).",
             cg->limit_bytes);
    AddGauge(&out, "knnd_cgroup_memory_usage_bytes",
             "Memory charged to knnd's cgroup in bytes, page cache included.",
             cg->usage_bytes);
    AddGauge(&out, "knnd_cgroup_memory_anonymous_bytes",
             "Anonymous memory of knnd's cgroup in bytes (never reclaimed; "
             "what the OOM killer acts on).",
             cg->anonymous_bytes);
    AddGauge(&out, "knnd_cgroup_memory_file_bytes",
             "Page cache charged to knnd's cgroup in bytes (reclaimable).",
             cg->file_bytes);
  }
  return out;
}

}  // namespace knnd
