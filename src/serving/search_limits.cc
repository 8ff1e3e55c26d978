#include "knnd/serving/search_limits.h"

#include <algorithm>

namespace knnd {

const char* DefaultsSourceName(DefaultsSource source) {
  switch (source) {
    case DefaultsSource::kConfig: return "config";
    case DefaultsSource::kTuned: return "tuned";
    case DefaultsSource::kIndex: return "index";
  }
  return "unknown";
}

SearchLimits ResolveLimits(const LimitsConfig& config, const IndexInfo& index) {
  SearchLimits limits;
  const bool tuned = index.tuned_nprobe > 0;
  limits.max_k = config.max_k;
  limits.max_queries_per_request = config.max_queries_per_request;
  limits.max_filter_ids = config.max_filter_ids;
  limits.filter = config.filter;
  limits.max_text_bytes = config.max_text_bytes;
  limits.max_get_ids = config.max_get_ids;
  const int nlist = static_cast<int>(std::max<int64_t>(1, index.nlist));
  limits.max_nprobe =
      config.max_nprobe > 0 ? std::min(config.max_nprobe, nlist) : nlist;
  const int nprobe = config.default_nprobe > 0 ? config.default_nprobe
                     : tuned                  ? index.tuned_nprobe
                                              : index.stored_nprobe;
  limits.default_nprobe = std::max(1, std::min(nprobe, limits.max_nprobe));
  limits.max_refine_factor = config.max_refine_factor;
  const int refine = config.default_refine_factor.has_value()
                         ? *config.default_refine_factor
                     : tuned ? index.tuned_refine_factor
                             : 0;
  limits.default_refine_factor =
      index.has_vectors ? std::min(refine, config.max_refine_factor) : 0;
  limits.defaults_source =
      config.default_nprobe > 0 || config.default_refine_factor.has_value()
          ? DefaultsSource::kConfig
      : tuned ? DefaultsSource::kTuned
              : DefaultsSource::kIndex;
  return limits;
}

}  // namespace knnd
