// Tuning the search defaults of an index: the fastest (nprobe,
// refine_factor) whose recall@k on held-out queries reaches a target,
// measured through IndexSnapshot::Search at one query per call on the
// calling thread (what one request of one query costs), or through a
// shard set searched as one (shard_set_search.h). `knnctl tune` stores
// the result in the index's sidecar (in every shard's, for a set), and
// knnd serves it when its config leaves default_nprobe /
// default_refine_factor unset (serving/search_limits.h). `knnctl eval`
// measures its grid with the same SweepSettings() and ChooseSetting().
//
// Thread-safety: pure functions of their arguments (FAISS searches run on
// the calling thread).
#ifndef KNND_INDEX_INDEX_TUNING_H_
#define KNND_INDEX_INDEX_TUNING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vector_io.h"

namespace knnd {

struct TuneOptions {
  int k = 10;
  double target_recall = 0.95;
  // Swept values; empty: DefaultNprobeSweep(nlist) and
  // DefaultRefineSweep(whether the snapshot has raw vectors).
  std::vector<int> nprobes;
  std::vector<int> refine_factors;
  // Queries sampled from the index: per query the answer id of its own row,
  // which the measured results and the truth leave out
  // (SweepOptions::leave_out). Empty for held-out queries.
  std::vector<int64_t> leave_out;
  // A setting reaches the target when its recall less confidence_z
  // standard errors (SweepRow::recall_se) does: 1.645, a one-sided 95%
  // bound, so that new queries of the same kind reach it too, not only
  // the measured ones (on the 1M set of bench/RESULTS.md "Filters", 0.952
  // over 1,000 sampled rows was 0.941 over 400 new queries); 0: the
  // measured mean itself.
  double confidence_z = 1.645;
};

// A row's recall[column] less z of its standard errors: the recall it
// reaches with the confidence z stands for.
double RecallBound(const SweepRow& row, size_t column, double z);

// The nprobe values tuning sweeps when none are given: 1, 2, 3, 4, 6, 8,
// 12, 16, 24, ... (powers of two and 1.5 times them) below nlist, then
// nlist. Steps of 1.5x instead of 2x: on Fashion-MNIST the fastest setting
// whose mean recall@10 reaches 0.95 is nprobe 6, refine_factor 3, 1.2x
// faster than the best of a powers-of-two grid (bench/RESULTS.md,
// "Frontier"); by the confidence bound, nprobe 8, refine_factor 3. The
// sweep stops at the first nprobe reaching the target, so the finer grid
// costs little.
std::vector<int> DefaultNprobeSweep(int64_t nlist);
// The refine_factor values likewise: 0, 1, 2, 3, 4, 6, 8, 12, 16 with raw
// vectors, else only 0.
std::vector<int> DefaultRefineSweep(bool has_vectors);

// A grid of settings measured at one k.
struct SettingsSweep {
  // Neighbours per search, as a request's k (re-ranking takes
  // refine_factor * k candidates).
  int k = 10;
  std::vector<int> nprobes;  // ascending, each in [1, nlist]
  std::vector<int> refine_factors;
  // The recall columns of each SweepRow, each <= k; one of them is k.
  // Empty: {k}.
  std::vector<int> recall_at;
  int64_t batch_rows = 1;  // queries per search call
  // As SweepOptions::leave_out.
  absl::Span<const int64_t> leave_out;
  // > 0: for each refine_factor, nprobe stops rising once recall@k less
  // confidence_z standard errors reaches this (a larger nprobe only costs
  // more); 0: every nprobe is measured.
  double stop_at_recall = 0;
  double confidence_z = 0;
};

// Measures every (refine_factor, nprobe) of `sweep`, refine_factor by
// refine_factor and nprobe ascending, through SweepNprobe; `measured`, when
// set, sees each row as soon as it is measured. `truth` as SweepNprobe's.
absl::StatusOr<std::vector<SweepRow>> SweepSettings(
    const MeasuredIndex& index, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const SettingsSweep& sweep,
    const std::function<void(const SweepRow&)>& measured = nullptr);

// The setting to serve of `rows` (not empty): the fastest whose
// RecallBound(row, column, z) reaches `target` (`reached`), else the
// fastest whose recall[column] is within `tolerance` of the best one.
struct Choice {
  bool reached = false;
  const SweepRow* row = nullptr;
};
Choice ChooseSetting(absl::Span<const SweepRow> rows, size_t column,
                     double target, double z, double tolerance);

struct TuneResult {
  // Whether any setting reached the target; `chosen` is then the fastest
  // that did, else the one with the highest recall.
  bool reached = false;
  SweepRow chosen;
  // Every setting measured, in sweep order (for each refine_factor,
  // nprobe ascending until the target is reached: a larger nprobe is only
  // slower).
  std::vector<SweepRow> measured;
};

// The fastest of `rows` whose RecallBound(row, column, z) reaches `target`
// (the first of equally fast ones), or null when none does.
const SweepRow* FastestReaching(absl::Span<const SweepRow> rows, size_t column,
                                double target, double z = 0);

// `truth` holds truth_k >= options.k exact neighbour ids per query.
absl::StatusOr<TuneResult> TuneSearchDefaults(const MeasuredIndex& index,
                                              const Matrix& queries,
                                              absl::Span<const int64_t> truth,
                                              int truth_k,
                                              const TuneOptions& options);
inline absl::StatusOr<TuneResult> TuneSearchDefaults(
    const IndexSnapshot& snapshot, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const TuneOptions& options) {
  return TuneSearchDefaults(MeasuredSnapshot(snapshot), queries, truth,
                            truth_k, options);
}

// Records `result` in the sidecar of `index_path` (written atomically);
// `tuned_on` says which queries were used. FAILED_PRECONDITION when the
// index has no sidecar. A shard set records one result in every shard's
// sidecar, each through this.
absl::Status RecordTunedDefaults(const std::string& index_path,
                                 const TuneOptions& options,
                                 const TuneResult& result,
                                 const std::string& tuned_on);

// `count` rows of `base` chosen with a fixed seed, as queries when none
// are given; their row numbers in `rows` when not null. They are indexed
// too, so each finds itself: tuning leaves each one's own row out of its
// results and its truth (TuneOptions::leave_out), as for a new query.
Matrix SampleRows(const Matrix& base, int64_t count, uint32_t seed,
                  std::vector<int64_t>* rows = nullptr);

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_TUNING_H_
