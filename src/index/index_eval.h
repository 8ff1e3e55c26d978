// Measuring an index: exact ground truth with a flat (brute-force) index,
// recall of approximate results against it, and a sweep of nprobe through
// IndexSnapshot, the daemon's own search path, or through a shard set
// searched and merged as a front merges it (shard_set_search.h).
//
// Thread-safety: pure functions; FAISS may use all cores inside them.
#ifndef KNND_INDEX_INDEX_EVAL_H_
#define KNND_INDEX_INDEX_EVAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/faiss/search_args.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vector_io.h"

namespace knnd {

// The exact k nearest rows of `base` for every query (queries.rows * k ids,
// row-major, closest first) under `metric`; for kCosine both sides are
// normalised (on copies). Memory: the flat index holds its own copy of the
// base (rows * dim * 4 bytes), plus queries.rows * k * 12 bytes of results.
absl::StatusOr<std::vector<int64_t>> ExactNeighbors(const Matrix& base,
                                                    const Matrix& queries,
                                                    int k, Metric metric);

// What eval and tune measure: one loaded index (MeasuredSnapshot) or the
// shards of one split searched as one (ShardSetSearch). Search() answers
// plain k-NN searches (queries, num_queries, k, nprobe, refine_factor into
// ids and distances) as knnd answers a request of them.
//
// Thread-safety: implementations are immutable; Search() is const.
class MeasuredIndex {
 public:
  virtual ~MeasuredIndex() = default;
  // dim, metric, nlist, ntotal and has_vectors describe what is searched.
  virtual const IndexInfo& info() const = 0;
  virtual absl::Status Search(const SearchArgs& args) const = 0;
  // The id answers carry for row `row` of the indexed vectors
  // (0 <= row < info().ntotal).
  virtual int64_t IdOfRow(int64_t row) const = 0;
};

// One IndexSnapshot, borrowed: it must outlive this.
class MeasuredSnapshot final : public MeasuredIndex {
 public:
  explicit MeasuredSnapshot(const IndexSnapshot& snapshot)
      : snapshot_(snapshot) {}
  const IndexInfo& info() const override { return snapshot_.info(); }
  absl::Status Search(const SearchArgs& args) const override {
    return snapshot_.Search(args);
  }
  int64_t IdOfRow(int64_t row) const override {
    return snapshot_.IdOfRow(row);
  }

 private:
  const IndexSnapshot& snapshot_;
};

// `rows` (rows of the indexed vectors, as ExactNeighbors() gives them; -1
// for none) turned in place into the ids `index` answers with
// (MeasuredIndex::IdOfRow), so that own ids score as row ids do.
void RowsToAnswerIds(const MeasuredIndex& index, std::vector<int64_t>& rows);
inline void RowsToAnswerIds(const IndexSnapshot& snapshot,
                            std::vector<int64_t>& rows) {
  RowsToAnswerIds(MeasuredSnapshot(snapshot), rows);
}

// R-recall@R, as ann-benchmarks reports it: the mean over queries of
// |first R results ∩ first R true neighbours| / R. `results` has
// `results_k` ids per query and `truth` `truth_k`; both must be >= r.
double RecallAt(absl::Span<const int64_t> results, int results_k,
                absl::Span<const int64_t> truth, int truth_k, int r,
                double* standard_error = nullptr);
// With `standard_error`, also the standard error of that mean (the sample
// standard deviation of the per-query recalls over sqrt(queries); 0 for
// fewer than two queries).

struct SweepRow {
  int nprobe = 0;
  int refine_factor = 0;
  std::vector<double> recall;  // one per SweepOptions::recall_at
  // The standard error of each recall: the standard deviation of the
  // queries' own recalls over sqrt(queries).
  std::vector<double> recall_se;
  double queries_per_second = 0;
};

struct SweepOptions {
  std::vector<int> nprobes;  // each <= nlist
  // Neighbours each search asks for, as a request's k: re-ranking takes
  // refine_factor * k candidates, so a setting measured at another k than
  // it is served at would not serve the recall measured.
  int k = 10;
  std::vector<int> recall_at;  // R values, each <= k and <= truth_k
  // Queries per Search call (as the daemon's batches would be).
  int64_t batch_rows = 1024;
  // Exact re-ranking of refine_factor * k candidates (0: off); > 0 needs
  // the snapshot's raw vectors.
  int refine_factor = 0;
  // Empty, or one answer id per query that its results leave out: queries
  // sampled from the indexed rows find themselves, which new queries
  // cannot. Each query is then searched for one result more and scored on
  // its results without that id (or without the last, when it is not
  // among them); the truth must leave it out too (LeaveOut()).
  absl::Span<const int64_t> leave_out;
};

// Per query, its `k` + 1 ids of `ids` (row-major) without `leave_out[q]`,
// or without the last when that id is not among them: k ids per query.
std::vector<int64_t> LeaveOut(absl::Span<const int64_t> ids, int k,
                              absl::Span<const int64_t> leave_out);

// Searches every query at each nprobe (and options.refine_factor, at
// options.k) through index.Search() and scores it against `truth`
// (truth_k ids per query). queries_per_second is wall time over the whole
// query set.
absl::StatusOr<std::vector<SweepRow>> SweepNprobe(
    const MeasuredIndex& index, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const SweepOptions& options);
inline absl::StatusOr<std::vector<SweepRow>> SweepNprobe(
    const IndexSnapshot& snapshot, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const SweepOptions& options) {
  return SweepNprobe(MeasuredSnapshot(snapshot), queries, truth, truth_k,
                     options);
}

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_EVAL_H_
