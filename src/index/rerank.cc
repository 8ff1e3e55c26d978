#include "knnd/index/rerank.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

// Exact distance of `query` to row `id`; `scratch` holds dim floats for
// decoding float16 rows.
float RowDistance(const VectorsFile& vectors, Metric metric,
                  const float* query, int64_t row, float* scratch) {
  return ExactDistance(metric, query, vectors.RowAsFloats(row, scratch),
                       static_cast<size_t>(vectors.dim()));
}

// Rows whose reads are in flight ahead of the distance being computed: all
// of a query's candidates at once for re-ranking (40 to 160 rows), a
// sliding window over the exact plan's thousands of matching rows, whose
// first lines would otherwise leave the cache before their turn.
constexpr int kRowsAhead = 512;

// rows[j] = the row of candidates[j] (-1 for none); the reads of the first
// kRowsAhead rows started (VectorsFile::PrefetchRow) before any distance is
// computed. The caller starts row j + kRowsAhead's (PrefetchAhead) as it
// reaches row j.
void PrefetchCandidateRows(const VectorsFile& vectors,
                           const ListIds& list_ids, const int64_t* candidates,
                           int kc, int64_t* rows) {
  for (int j = 0; j < kc; ++j) {
    rows[j] = list_ids.RowOf(candidates[j]);
    if (j < kRowsAhead && rows[j] >= 0) vectors.PrefetchRow(rows[j]);
  }
}

inline void PrefetchAhead(const VectorsFile& vectors, const int64_t* rows,
                          int j, int kc) {
  if (j + kRowsAhead < kc && rows[j + kRowsAhead] >= 0) {
    vectors.PrefetchRow(rows[j + kRowsAhead]);
  }
}

// The number of valid (id >= 0) entries when they come first and in order
// of estimate (closest first), as an index's search returns them; -1 when
// the entries are in any other order.
int ValidInEstimateOrder(bool ascending, const int64_t* ids,
                         const float* estimates, int kf) {
  int valid = 0;
  while (valid < kf && ids[valid] >= 0) ++valid;
  for (int j = valid; j < kf; ++j) {
    if (ids[j] >= 0) return -1;
  }
  for (int j = 1; j < valid; ++j) {
    if (ascending ? estimates[j] < estimates[j - 1]
                  : estimates[j] > estimates[j - 1]) {
      return -1;
    }
  }
  return valid;
}

}  // namespace

void RerankExact(const VectorsFile& vectors, const ListIds& list_ids,
                 Metric metric, const float* queries, int64_t num_queries,
                 int kc, const int64_t* candidates, int k, float* distances,
                 int64_t* ids) {
  const bool ascending = SmallerIsCloser(metric);
  const float pad = MissingDistance(metric);
  const int dim = vectors.dim();
  std::vector<float> scratch(static_cast<size_t>(dim));
  std::vector<std::pair<float, int64_t>> scored;
  scored.reserve(static_cast<size_t>(kc));
  auto closer = [ascending](const std::pair<float, int64_t>& a,
                            const std::pair<float, int64_t>& b) {
    if (a.first != b.first) {
      return ascending ? a.first < b.first : a.first > b.first;
    }
    return a.second < b.second;
  };
  std::vector<int64_t> rows(static_cast<size_t>(kc));
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* query = queries + q * dim;
    PrefetchCandidateRows(vectors, list_ids, candidates + q * kc, kc,
                          rows.data());
    scored.clear();
    for (int j = 0; j < kc; ++j) {
      PrefetchAhead(vectors, rows.data(), j, kc);
      const int64_t row = rows[j];
      if (row < 0) continue;
      scored.emplace_back(
          RowDistance(vectors, metric, query, row, scratch.data()),
          list_ids.IdOfRow(row));
    }
    const size_t keep = std::min(scored.size(), static_cast<size_t>(k));
    std::partial_sort(scored.begin(), scored.begin() + keep, scored.end(),
                      closer);
    for (int j = 0; j < k; ++j) {
      const bool have = static_cast<size_t>(j) < keep;
      distances[q * k + j] = have ? scored[j].first : pad;
      ids[q * k + j] = have ? scored[j].second : -1;
    }
  }
}

void KeepBestCandidates(Metric metric, const int64_t* ids,
                        const float* estimates, int64_t num_queries, int kf,
                        int kc, int64_t* out_ids, float* out_estimates,
                        const ListIds& list_ids) {
  const bool ascending = SmallerIsCloser(metric);
  std::vector<int> order(static_cast<size_t>(kf));
  for (int64_t q = 0; q < num_queries; ++q) {
    const int64_t* qi = ids + q * kf;
    const float* qe = estimates + q * kf;
    for (int j = 0; j < kf; ++j) order[j] = j;
    if (ValidInEstimateOrder(ascending, qi, qe, kf) >= kc) {
      // Already in estimate order with kc valid ones first (the usual
      // case): only runs of equal estimates reaching into the first kc
      // need ordering by id; the same order the sort below gives.
      for (int a = 0; a < kc;) {
        int b = a + 1;
        while (b < kf && qi[b] >= 0 && qe[b] == qe[a]) ++b;
        if (b - a > 1) {
          std::sort(order.begin() + a, order.begin() + b, [&](int x, int y) {
            return list_ids.IdOf(qi[x]) < list_ids.IdOf(qi[y]);
          });
        }
        a = b;
      }
    } else {
      std::partial_sort(
          order.begin(), order.begin() + kc, order.end(), [&](int a, int b) {
            if ((qi[a] < 0) != (qi[b] < 0)) return qi[b] < 0;
            if (qe[a] != qe[b]) {
              return ascending ? qe[a] < qe[b] : qe[a] > qe[b];
            }
            return list_ids.IdOf(qi[a]) < list_ids.IdOf(qi[b]);
          });
    }
    for (int j = 0; j < kc; ++j) {
      out_ids[q * kc + j] = qi[order[j]];
      out_estimates[q * kc + j] = qe[order[j]];
    }
  }
}

void ExactCandidateDistances(const VectorsFile& vectors,
                             const ListIds& list_ids, Metric metric,
                             const float* queries, int64_t num_queries, int kc,
                             int64_t* candidates, float* distances) {
  const float pad = MissingDistance(metric);
  const int dim = vectors.dim();
  std::vector<float> scratch(static_cast<size_t>(dim));
  std::vector<int64_t> rows(static_cast<size_t>(kc));
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* query = queries + q * dim;
    PrefetchCandidateRows(vectors, list_ids, candidates + q * kc, kc,
                          rows.data());
    for (int j = 0; j < kc; ++j) {
      PrefetchAhead(vectors, rows.data(), j, kc);
      int64_t& id = candidates[q * kc + j];
      const int64_t row = rows[j];
      id = row < 0 ? -1 : list_ids.IdOfRow(row);
      distances[q * kc + j] =
          row < 0 ? pad
                  : RowDistance(vectors, metric, query, row, scratch.data());
    }
  }
}

}  // namespace knnd
