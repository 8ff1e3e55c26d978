// The one resolver of per-request limits and defaults. Search, GetIndexInfo,
// warm-up and the canary all take their nprobe, refine_factor and limits
// from ResolveLimits(), so that what GetIndexInfo reports is what Search
// applies.
//
// Thread-safety: pure functions.
#ifndef KNND_SERVING_SEARCH_LIMITS_H_
#define KNND_SERVING_SEARCH_LIMITS_H_

#include <cstdint>
#include <optional>

#include "knnd/index/attribute_filter.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {

// The configured limits (config fields of the same names). Defaults the
// config leaves unset come from the index: its tuned defaults (the
// sidecar's `knnctl tune` result) when it has them, else the nprobe saved
// in the file and no re-ranking.
struct LimitsConfig {
  int max_k = 1024;
  int64_t max_queries_per_request = 4096;
  int default_nprobe = 0;  // 0: unset, from the index
  int max_nprobe = 0;      // 0: nlist
  int64_t max_filter_ids = 1000000;
  // Applies to indexes with raw vectors; unset: from the index.
  std::optional<int> default_refine_factor;
  int max_refine_factor = 64;
  // max_filter_conditions, max_filter_depth.
  FilterLimits filter;
  int64_t max_text_bytes = 65536;  // each of a request's texts
  int64_t max_get_ids = 1024;      // ids of one GetRequest
};

// Where a snapshot's default nprobe and refine_factor came from.
enum class DefaultsSource { kConfig, kTuned, kIndex };
const char* DefaultsSourceName(DefaultsSource source);  // "config" ...

// The limits in force for one index.
struct SearchLimits {
  int max_k = 1024;
  int64_t max_queries_per_request = 4096;
  int default_nprobe = 1;  // in [1, max_nprobe]
  int max_nprobe = 1;      // in [1, nlist]
  int64_t max_filter_ids = 1000000;
  // The refine_factor a request without one gets: the configured default,
  // at most max_refine_factor, and 0 for an index without raw vectors.
  int default_refine_factor = 0;
  int max_refine_factor = 0;
  FilterLimits filter;
  int64_t max_text_bytes = 65536;
  int64_t max_get_ids = 1024;
  // kConfig when the config set either default, else kTuned when the
  // index has tuned defaults, else kIndex.
  DefaultsSource defaults_source = DefaultsSource::kIndex;
};

SearchLimits ResolveLimits(const LimitsConfig& config, const IndexInfo& index);

}  // namespace knnd

#endif  // KNND_SERVING_SEARCH_LIMITS_H_
