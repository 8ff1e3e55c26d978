#include "knnd/index/index_tuning.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "knnd/storage/index_metadata.h"

namespace knnd {

absl::StatusOr<TuneResult> TuneSearchDefaults(const IndexSnapshot& snapshot,
                                              const Matrix& queries,
                                              absl::Span<const int64_t> truth,
                                              int truth_k,
                                              const TuneOptions& options) {
  const IndexInfo& info = snapshot.info();
  if (!(options.target_recall > 0 && options.target_recall <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_recall=", options.target_recall, " is outside (0, 1]"));
  }
  std::vector<int> nprobes = options.nprobes;
  if (nprobes.empty()) {
    for (int64_t p = 1; p < info.nlist; p *= 2) {
      nprobes.push_back(static_cast<int>(p));
    }
    nprobes.push_back(static_cast<int>(info.nlist));
  }
  std::vector<int> refine_factors = options.refine_factors;
  if (refine_factors.empty()) {
    refine_factors = info.has_vectors ? std::vector<int>{0, 1, 2, 4, 8, 16}
                                      : std::vector<int>{0};
  }
  TuneResult result;
  bool have_best = false;
  for (int refine_factor : refine_factors) {
    for (int nprobe : nprobes) {
      SweepOptions sweep;
      sweep.nprobes = {nprobe};
      sweep.recall_at = {options.k};
      sweep.batch_rows = 1;
      sweep.refine_factor = refine_factor;
      absl::StatusOr<std::vector<SweepRow>> rows =
          SweepNprobe(snapshot, queries, truth, truth_k, sweep);
      if (!rows.ok()) return rows.status();
      const SweepRow& row = rows->front();
      result.measured.push_back(row);
      const bool reaches = row.recall[0] >= options.target_recall;
      const bool better =
          !have_best ||
          (reaches && (!result.reached ||
                       row.queries_per_second >
                           result.chosen.queries_per_second)) ||
          (!reaches && !result.reached &&
           row.recall[0] > result.chosen.recall[0]);
      if (better) {
        result.chosen = row;
        result.reached = result.reached || reaches;
        have_best = true;
      }
      if (reaches) break;  // a larger nprobe only costs more
    }
  }
  return result;
}

absl::Status RecordTunedDefaults(const std::string& index_path,
                                 const TuneOptions& options,
                                 const TuneResult& result,
                                 const std::string& tuned_on) {
  const std::string sidecar = MetadataPath(index_path);
  absl::StatusOr<knnd::v1::IndexMetadata> meta = ReadIndexMetadata(sidecar);
  if (absl::IsNotFound(meta.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index ", index_path, " has no sidecar ", sidecar,
        " to record the tuned defaults in (knnctl build writes one)"));
  }
  if (!meta.ok()) return meta.status();
  meta->set_tuned_nprobe(static_cast<uint32_t>(result.chosen.nprobe));
  meta->set_tuned_refine_factor(
      static_cast<uint32_t>(result.chosen.refine_factor));
  meta->set_tuned_k(static_cast<uint32_t>(options.k));
  meta->set_target_recall(options.target_recall);
  meta->set_tuned_recall(result.chosen.recall.empty() ? 0
                                                      : result.chosen.recall[0]);
  meta->set_tuned_queries_per_second(result.chosen.queries_per_second);
  meta->set_tuned_on(tuned_on);
  return WriteIndexMetadata(sidecar, *meta);
}

Matrix SampleRows(const Matrix& base, int64_t count, uint32_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(base.rows));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  Matrix sample;
  sample.dim = base.dim;
  sample.rows = std::min(count, base.rows);
  sample.values.reserve(static_cast<size_t>(sample.rows) * base.dim);
  for (int64_t i = 0; i < sample.rows; ++i) {
    const float* row = base.row(order[static_cast<size_t>(i)]);
    sample.values.insert(sample.values.end(), row, row + base.dim);
  }
  return sample;
}

}  // namespace knnd
