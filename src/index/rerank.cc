#include "knnd/index/rerank.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

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

// Rows whose distances are computed together (ExactDistances): their reads
// are in flight at once.
constexpr int kGroup = 8;

// Calls fn(j, row, distance) for each j < kc with rows[j] >= 0, in order of
// j, distance = the exact distance of `query` to that row, computed
// kGroup rows at a time; Row: the file's element type (float16 rows are
// converted as they are read).
template <typename Row, typename Fn>
void ForEachRowDistanceOf(const VectorsFile& vectors, Metric metric,
                        const float* query, const int64_t* rows, int kc,
                        Fn fn) {
  const size_t dim = static_cast<size_t>(vectors.dim());
  const Row* group[kGroup];
  int at[kGroup];
  float distance[kGroup];
  int j = 0;
  while (j < kc) {
    int n = 0;
    for (; j < kc && n < kGroup; ++j) {
      PrefetchAhead(vectors, rows, j, kc);
      if (rows[j] < 0) continue;
      group[n] = static_cast<const Row*>(vectors.row(rows[j]));
      at[n++] = j;
    }
    ExactDistances(metric, query, group, static_cast<size_t>(n), dim,
                   distance);
    for (int g = 0; g < n; ++g) fn(at[g], rows[at[g]], distance[g]);
  }
}

template <typename Fn>
void ForEachRowDistance(const VectorsFile& vectors, Metric metric,
                        const float* query, const int64_t* rows, int kc,
                        Fn fn) {
  if (vectors.dtype() == VectorsDtype::kFloat16) {
    ForEachRowDistanceOf<uint16_t>(vectors, metric, query, rows, kc, fn);
  } else {
    ForEachRowDistanceOf<float>(vectors, metric, query, rows, kc, fn);
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
    ForEachRowDistance(vectors, metric, query, rows.data(), kc,
                       [&](int, int64_t row, float distance) {
                         scored.emplace_back(distance, list_ids.IdOfRow(row));
                       });
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
  std::vector<int64_t> rows(static_cast<size_t>(kc));
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* query = queries + q * dim;
    int64_t* ids = candidates + q * kc;
    float* out = distances + q * kc;
    PrefetchCandidateRows(vectors, list_ids, ids, kc, rows.data());
    for (int j = 0; j < kc; ++j) {
      if (rows[j] < 0) {
        ids[j] = -1;
        out[j] = pad;
      }
    }
    ForEachRowDistance(vectors, metric, query, rows.data(), kc,
                       [&](int j, int64_t row, float distance) {
                         ids[j] = list_ids.IdOfRow(row);
                         out[j] = distance;
                       });
  }
}

}  // namespace knnd
