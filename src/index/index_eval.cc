#include "knnd/index/index_eval.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

// A copy of m's values, L2-normalised row by row.
std::vector<float> Normalized(const Matrix& m) {
  std::vector<float> copy = m.values;
  NormalizeRows(copy.data(), m.rows, m.dim);
  return copy;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ExactNeighbors(const Matrix& base,
                                                    const Matrix& queries,
                                                    int k, Metric metric) {
  if (base.dim != queries.dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("base vectors have dim=", base.dim,
                     " but queries have dim=", queries.dim));
  }
  if (k <= 0 || k > base.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k=", k, " must be in [1, ", base.rows, "] (the base rows)"));
  }
  std::vector<float> base_copy;
  std::vector<float> query_copy;
  const float* x = base.values.data();
  const float* q = queries.values.data();
  if (metric == Metric::kCosine) {
    base_copy = Normalized(base);
    query_copy = Normalized(queries);
    x = base_copy.data();
    q = query_copy.data();
  }
  std::vector<int64_t> ids(static_cast<size_t>(queries.rows) * k);
  std::vector<float> distances(ids.size());
  if (absl::Status s = ExactKnn(x, base.rows, q, queries.rows, base.dim, k,
                                metric, distances.data(), ids.data());
      !s.ok()) {
    return s;
  }
  return ids;
}

void RowsToAnswerIds(const MeasuredIndex& index, std::vector<int64_t>& rows) {
  for (int64_t& row : rows) {
    if (row >= 0) row = index.IdOfRow(row);
  }
}

double RecallAt(absl::Span<const int64_t> results, int results_k,
                absl::Span<const int64_t> truth, int truth_k, int r,
                double* standard_error) {
  const int64_t n = static_cast<int64_t>(truth.size()) / truth_k;
  if (standard_error != nullptr) *standard_error = 0;
  if (n == 0) return 0;
  int64_t found = 0;
  double sum_sq = 0;  // of the per-query found counts
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < n; ++i) {
    expected.assign(truth.begin() + i * truth_k,
                    truth.begin() + i * truth_k + r);
    std::sort(expected.begin(), expected.end());
    int64_t found_here = 0;
    for (int j = 0; j < r; ++j) {
      const int64_t id = results[i * results_k + j];
      if (id >= 0 &&
          std::binary_search(expected.begin(), expected.end(), id)) {
        ++found_here;
      }
    }
    found += found_here;
    sum_sq += static_cast<double>(found_here * found_here);
  }
  const double mean = static_cast<double>(found) / static_cast<double>(n * r);
  if (standard_error != nullptr && n > 1) {
    // Per-query recalls f/r: variance from the sums of f and f^2.
    const double m = static_cast<double>(found) / static_cast<double>(n);
    const double variance =
        std::max(0.0, (sum_sq - static_cast<double>(n) * m * m) /
                          static_cast<double>(n - 1)) /
        (static_cast<double>(r) * r);
    *standard_error = std::sqrt(variance / static_cast<double>(n));
  }
  return mean;
}

std::vector<int64_t> LeaveOut(absl::Span<const int64_t> ids, int k,
                              absl::Span<const int64_t> leave_out) {
  std::vector<int64_t> kept;
  kept.reserve(leave_out.size() * static_cast<size_t>(k));
  for (size_t q = 0; q < leave_out.size(); ++q) {
    const int64_t* row = ids.data() + q * static_cast<size_t>(k + 1);
    int taken = 0;
    for (int j = 0; j <= k && taken < k; ++j) {
      if (row[j] == leave_out[q] && row[j] >= 0) continue;
      kept.push_back(row[j]);
      ++taken;
    }
  }
  return kept;
}

absl::StatusOr<std::vector<SweepRow>> SweepNprobe(
    const MeasuredIndex& index, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const SweepOptions& options) {
  const IndexInfo& info = index.info();
  if (queries.dim != info.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queries have dim=", queries.dim, " but the index has dim=", info.dim));
  }
  if (static_cast<int64_t>(truth.size()) != queries.rows * truth_k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ground truth has ", truth.size() / std::max(truth_k, 1),
        " rows but there are ", queries.rows, " queries"));
  }
  const int k = options.k;
  if (k < 1 || k > info.ntotal) {
    return absl::InvalidArgumentError(
        absl::StrCat("k=", k, " is outside [1, ntotal=", info.ntotal, "]"));
  }
  for (int r : options.recall_at) {
    if (r < 1 || r > k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recall@", r, " is outside [1, k=", k,
          "]: a search of k neighbours answers recall@1 to recall@k"));
    }
    if (r > truth_k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recall@", r, " needs ", r, " true neighbours per query; the "
          "ground truth has ", truth_k));
    }
  }
  const bool leaves_out = !options.leave_out.empty();
  if (leaves_out &&
      static_cast<int64_t>(options.leave_out.size()) != queries.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leave_out has ", options.leave_out.size(), " ids for ", queries.rows,
        " queries"));
  }
  const int searched_k = leaves_out ? k + 1 : k;
  std::vector<int64_t> ids(static_cast<size_t>(queries.rows) * searched_k);
  std::vector<float> distances(ids.size());
  const int64_t batch = std::max<int64_t>(1, options.batch_rows);
  std::vector<SweepRow> rows;
  for (int nprobe : options.nprobes) {
    if (nprobe < 1 || nprobe > info.nlist) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nprobe=", nprobe, " is outside [1, nlist=", info.nlist, "]"));
    }
    const absl::Time start = absl::Now();
    for (int64_t begin = 0; begin < queries.rows; begin += batch) {
      SearchArgs args;
      args.queries = queries.row(begin);
      args.num_queries = std::min(batch, queries.rows - begin);
      args.k = searched_k;
      args.nprobe = nprobe;
      args.refine_factor = options.refine_factor;
      args.distances = distances.data() + begin * searched_k;
      args.ids = ids.data() + begin * searched_k;
      if (absl::Status s = index.Search(args); !s.ok()) return s;
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    SweepRow row;
    row.nprobe = nprobe;
    row.refine_factor = options.refine_factor;
    const std::vector<int64_t> scored =
        leaves_out ? LeaveOut(ids, k, options.leave_out) : ids;
    for (int r : options.recall_at) {
      double se = 0;
      row.recall.push_back(RecallAt(scored, k, truth, truth_k, r, &se));
      row.recall_se.push_back(se);
    }
    row.queries_per_second =
        seconds > 0 ? static_cast<double>(queries.rows) / seconds : 0;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace knnd
