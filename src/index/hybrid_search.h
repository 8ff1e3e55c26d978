// Hybrid retrieval: a query's vector and text (BM25, text/text_index.h)
// searched over one pinned version with one prepared filter, and their
// results fused (RRF or weighted scores) into one answer. The retrievers
// are the two plans of one request: the vector search runs as every
// search does (IndexSnapshot::Search with the prepared filter's plan) for
// `vector_window` candidates; the text search scores every row holding a
// query term and keeps the `text_window` best of those the same filter
// and allow-list admit (exactly: no post-filter, no hole); the fusion
// then ranks the union.
//
// Thread-safety: pure functions over an immutable snapshot.
#ifndef KNND_INDEX_HYBRID_SEARCH_H_
#define KNND_INDEX_HYBRID_SEARCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "knnd/faiss/search_args.h"
#include "knnd/index/hybrid_fusion.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/prepared_filter.h"

namespace knnd {

// The text side of a request and how it fuses, validated; `fusion` is
// Fusion::kNone exactly when there are no vectors.
struct HybridQuery : FusionParams {
  // Per query: its text's terms in the snapshot's text index
  // (TextIndex::QueryTerms).
  std::vector<std::vector<uint32_t>> terms;
  int vector_window = 1;  // >= k; unused without vectors
  int text_window = 1;    // >= k
  // For a merger of shards (SearchRequest.return_candidates): each query's
  // answer is its vector window (vector_window entries, the distances)
  // then its text window (text_window entries, the BM25 scores), each as
  // its retriever ranked it, padded with id -1, unfused: the merger ranks
  // each retriever's lists over every shard and fuses those
  // (rpc/shard_merge.h). The answer's width, args.k, is then
  // vector_window + text_window (vector_window 0 without vectors).
  bool windows = false;
};

// Per result entry (num_queries * k, the caller's buffers): each
// retriever's rank (from 1; 0: not in its window) and score; the vector
// ones may be null without vectors. `vector_time` and `text_time`, when
// not null, are set to the time each retriever took.
struct HybridOutputs {
  uint32_t* vector_ranks = nullptr;
  float* vector_scores = nullptr;
  uint32_t* text_ranks = nullptr;
  float* text_scores = nullptr;
  absl::Duration* vector_time = nullptr;
  absl::Duration* text_time = nullptr;
};

// Searches queries [first, first + args.num_queries) of `query` on
// `snapshot`, which must have a text index: args.queries holds their
// vectors unless query.fusion is kNone (then null); args.k results each
// go to args.ids and args.distances (FuseResults(): the fused score, or
// BM25's alone, larger first; equal scores by id; missing results id -1
// with score -inf; or with query.windows each retriever's window);
// args.allowed_ids and `filter` (prepared for a search of vector_window
// results) admit rows for both retrievers. FAILED_PRECONDITION without a
// text index; the vector search's errors as they are.
absl::Status SearchHybrid(const IndexSnapshot& snapshot, const SearchArgs& args,
                          const PreparedFilter* filter,
                          const HybridQuery& query, int64_t first,
                          const HybridOutputs& out);

}  // namespace knnd

#endif  // KNND_INDEX_HYBRID_SEARCH_H_
