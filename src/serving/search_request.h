// Parsing and validation of a SearchRequest against the served index and the
// server's limits. Every rejection is INVALID_ARGUMENT with a message that
// names the field, its value and the limit, e.g. "k=5000 exceeds max_k=1024",
// except refine_factor > 0 on an index without raw vectors:
// FAILED_PRECONDITION.
//
// Thread-safety: pure functions.
#ifndef KNND_SERVING_SEARCH_REQUEST_H_
#define KNND_SERVING_SEARCH_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "knnd/index/hybrid_search.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/serving/search_limits.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// A validated request. `queries` points into the request message (or into
// `aligned_copy` when the byte payload was not 4-byte aligned), so the
// request must outlive it.
struct ParsedSearch {
  const float* queries = nullptr;  // null: texts alone
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 0;
  int refine_factor = 0;  // 0: no re-ranking
  std::vector<int64_t> allowed_ids;  // sorted, unique
  // request.filter prepared against the pinned snapshot (ParseFilter;
  // index/prepared_filter.h): its form, matched rows and plan. A compiled
  // filter holds allowed_ids, which is then empty.
  std::optional<PreparedFilter> filter;
  // With texts: how the request fuses, and (ParseTexts) each text's terms.
  std::optional<HybridQuery> hybrid;
  std::vector<float> aligned_copy;
};

absl::StatusOr<ParsedSearch> ParseSearchRequest(
    const knnd::v1::SearchRequest& request, const IndexInfo& index,
    const SearchLimits& limits);

// The terms of each of request.texts in `snapshot`'s text index into
// parsed.hybrid (set by ParseSearchRequest when the request has texts):
// INVALID_ARGUMENT when the snapshot has no text index or a text is over
// limits.max_text_bytes. Runs before the request is admitted, as
// ParseFilter() does, and before it (the filter is prepared for the vector
// window).
absl::Status ParseTexts(const knnd::v1::SearchRequest& request,
                        const IndexSnapshot& snapshot,
                        const SearchLimits& limits, ParsedSearch& parsed);

// Prepares request.filter, when set, against the pinned `snapshot` for
// parsed's shape into parsed.filter (PrepareFilter, prepared_filter.h,
// which says how: the filter cache, a bitmap or a numeric condition's
// bounds, the plan), folding parsed.allowed_ids into it when it compiles a
// bitmap: INVALID_ARGUMENT as attribute_filter.h says (unknown attribute,
// wrong type, malformed filter, over limits.filter). Runs before the
// request is admitted, so that a bad filter never queues.
absl::Status ParseFilter(const knnd::v1::SearchRequest& request,
                         const IndexSnapshot& snapshot,
                         const SearchLimits& limits, ParsedSearch& parsed);

// Whether the answer holds every re-ranking candidate (refine_factor * k
// per query, with their PQ estimates) for a merger of shards: asked by
// return_candidates, with re-ranking, and without a filter. A merger of
// filtered answers takes the k best exact distances over every shard's
// (shard_merge.h: each shard planned alone), so a shard's own k best exact
// are all it can use: k per query, and refine_factor times fewer payloads.
bool AnswersWithCandidates(const knnd::v1::SearchRequest& request,
                           const ParsedSearch& parsed);

// Entries per query of the answer: k; refine_factor * k with
// AnswersWithCandidates(); for a hybrid request asked for its windows
// (return_candidates), vector_window (with vectors) + text_window.
int64_t AnswerWidth(const knnd::v1::SearchRequest& request,
                    const ParsedSearch& parsed);

}  // namespace knnd

#endif  // KNND_SERVING_SEARCH_REQUEST_H_
