#include "knnd/index/canary.h"

#include <algorithm>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace knnd {
namespace {

// Top-k ids of every query of `set` in `snapshot` at `nprobe`.
absl::StatusOr<std::vector<int64_t>> TopK(const CanarySet& set,
                                          const IndexSnapshot& snapshot,
                                          int k, int nprobe,
                                          const CanaryRunner& run) {
  const int64_t n = set.queries.rows;
  std::vector<float> distances(static_cast<size_t>(n) * k);
  std::vector<int64_t> ids(static_cast<size_t>(n) * k);
  SearchArgs args;
  args.queries = set.queries.values.data();
  args.num_queries = n;
  args.k = k;
  args.nprobe = nprobe;
  args.distances = distances.data();
  args.ids = ids.data();
  absl::Status status = run([&] { return snapshot.Search(args); });
  if (!status.ok()) return status;
  return ids;
}

}  // namespace

absl::StatusOr<CanarySet> LoadCanarySet(const std::string& queries_path,
                                        const std::string& ground_truth_path) {
  CanarySet set;
  absl::StatusOr<Matrix> queries = ReadVectors(queries_path);
  if (!queries.ok()) return queries.status();
  if (queries->rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("canary queries ", queries_path, " hold no vector"));
  }
  if (queries->rows > kMaxCanaryQueries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "canary queries ", queries_path, " hold ", queries->rows,
        " vectors; at most ", kMaxCanaryQueries,
        " (each reload searches them twice, once exhaustively)"));
  }
  set.queries = *std::move(queries);
  if (!ground_truth_path.empty()) {
    absl::StatusOr<IdMatrix> truth = ReadIds(ground_truth_path);
    if (!truth.ok()) return truth.status();
    if (truth->rows != set.queries.rows || truth->cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "canary ground truth ", ground_truth_path, " has ", truth->rows,
          " rows of ", truth->cols, " ids; the queries ", queries_path,
          " need ", set.queries.rows, " rows of at least 1"));
    }
    set.ground_truth = *std::move(truth);
  }
  return set;
}

absl::StatusOr<double> CheckCanary(const CanarySet& set,
                                   const IndexSnapshot& candidate,
                                   const IndexSnapshot* serving,
                                   const CanaryOptions& options,
                                   const CanaryRunner& run) {
  const IndexInfo& info = candidate.info();
  if (set.queries.dim != info.dim) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "canary queries have dim=%d, the index dim=%d", set.queries.dim,
        info.dim));
  }
  const bool has_truth = set.ground_truth.rows > 0;
  if (!has_truth && serving == nullptr) {
    return absl::FailedPreconditionError(
        "canary check needs a ground truth or a version serving");
  }
  int k = options.k;
  if (has_truth) k = std::min(k, set.ground_truth.cols);
  k = static_cast<int>(std::min<int64_t>(k, info.ntotal));
  if (k < 1) {
    return absl::FailedPreconditionError("canary check: the index is empty");
  }

  std::vector<int64_t> reference;
  int reference_stride = k;
  if (has_truth) {
    reference = set.ground_truth.values;
    reference_stride = set.ground_truth.cols;
  } else {
    absl::StatusOr<std::vector<int64_t>> ids = TopK(
        set, *serving, k, static_cast<int>(serving->info().nlist), run);
    if (!ids.ok()) return ids.status();
    reference = *std::move(ids);
  }
  absl::StatusOr<std::vector<int64_t>> found =
      TopK(set, candidate, k, options.nprobe, run);
  if (!found.ok()) return found.status();

  int64_t hits = 0;
  int64_t expected = 0;
  for (int64_t q = 0; q < set.queries.rows; ++q) {
    std::unordered_set<int64_t> want;
    for (int j = 0; j < k; ++j) {
      const int64_t id = reference[q * reference_stride + j];
      if (id >= 0) want.insert(id);
    }
    expected += static_cast<int64_t>(want.size());
    for (int j = 0; j < k; ++j) hits += want.count((*found)[q * k + j]);
  }
  const double recall =
      expected == 0 ? 1.0 : static_cast<double>(hits) / expected;
  if (recall < options.min_recall) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "canary recall@%d = %.4f over %d queries (nprobe %d) against %s is "
        "below canary_min_recall = %.4f",
        k, recall, set.queries.rows, options.nprobe,
        has_truth ? "the ground truth"
                  : absl::StrCat("version ", serving->info().version,
                                 " searched exhaustively"),
        options.min_recall));
  }
  return recall;
}

}  // namespace knnd
