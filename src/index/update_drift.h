// Drift of an index version made without training (index_update.h,
// `knnctl update`, docs/updates.md "Drift"): how far the delta's
// quantization error and the list sizes have moved, from the base's and
// from the trained reference knnctl build recorded in the sidecar (carried
// unchanged through every update, with the rows added and deleted since),
// recall@10 on a sample of the delta against exact search over the new
// INDEX.vectors, and whether a full retrain is due.
//
// Thread-safety: pure functions (FAISS and the exact scan may use all
// cores inside them); a TrainedReferenceSample is used by one thread.
#ifndef KNND_INDEX_UPDATE_DRIFT_H_
#define KNND_INDEX_UPDATE_DRIFT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/index/update_plan.h"
#include "knnd/storage/vector_io.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

class FastScanUpdate;
class IndexBuilder;
struct IndexInfo;

// Thresholds past which a full retrain is due (docs/updates.md). The error
// and imbalance ratios apply to the delta against its base and against the
// trained reference alike.
inline constexpr double kRetrainErrorRatio = 1.2;
inline constexpr double kRetrainImbalanceRatio = 1.5;
inline constexpr double kRetrainRecallDrop = 0.02;
// Rows added plus rows deleted since training, as a fraction of the rows
// the build held, past which a retrain is due even when no figure moved:
// the quantizers describe a corpus a third of which is gone or new.
inline constexpr double kRetrainChangedFraction = 1.0 / 3;

// Rows whose quantization error is measured by default, on each side, and
// the default seed: knnctl build samples its reference rows as knnctl
// update samples its base's, so that a first update's base figures are the
// reference's.
inline constexpr int64_t kDriftSampleRows = 10000;
inline constexpr uint32_t kDriftSeed = 1;

struct UpdateDrift {
  // Mean squared distance to the nearest centroid and PQ reconstruction
  // error, of a sample of the base's vectors and of the delta's; 0 when a
  // side has no vectors to sample.
  double base_coarse_error = 0;
  double base_pq_error = 0;
  double new_coarse_error = 0;
  double new_pq_error = 0;
  // FAISS's imbalance factor of the list sizes: nlist * sum(n^2) /
  // (sum n)^2, 1 when even.
  double base_imbalance = 0;
  double new_imbalance = 0;
  // The base sidecar's trained reference (has_trained false: an index
  // built before the sidecar recorded it, or converted: the base's
  // figures are the only comparison), and the rows added (additions and
  // upserts) and deleted since training, this update included.
  bool has_trained = false;
  knnd::v1::IndexMetadata::TrainedReference trained;
  int64_t rows_added_since_training = 0;
  int64_t rows_deleted_since_training = 0;
  // recall@10 of the new version on `recall_queries` rows at nprobe /
  // refine_factor (the tuned setting, else the stored nprobe); -1: not
  // measured. tuned_recall: what `knnctl tune` recorded, 0 if never tuned.
  double recall = -1;
  int64_t recall_queries = 0;
  int recall_nprobe = 0;
  int recall_refine_factor = 0;
  double tuned_recall = 0;
  // Why a full retrain is due; empty: not yet.
  std::vector<std::string> retrain_reasons;
};

// nlist * sum(n^2) / (sum n)^2: 1 for equal lists, more as they skew; 0
// for no vectors.
double ListImbalance(const std::vector<int64_t>& sizes);

// min(count, rows) distinct rows out of `rows`, seeded, ascending.
std::vector<int64_t> SampleRowNumbers(int64_t rows, int64_t count,
                                      uint32_t seed);

// Copies the base sidecar's trained reference into `drift` and, counted
// with this update's rows (`plan`: additions and upserts added, deletions
// deleted), into the new version's sidecar `metadata` (a copy of the
// base's). Without a reference the counters stay 0: nobody knows what
// changed since training.
void CarryTrainedReference(const UpdatePlan& plan,
                           knnd::v1::IndexMetadata& metadata,
                           UpdateDrift& drift);

// The error and imbalance figures: a sample of the base's INDEX.vectors
// (when it has one) and of `delta` (the normalised input, or null) under
// the base's quantizers, and the list sizes before and after.
absl::Status MeasureQuantizationDrift(const FastScanUpdate& update,
                                      const IndexInfo& base,
                                      const Matrix* delta,
                                      absl::Span<const int64_t> new_row_of_base,
                                      int64_t sample_rows, uint32_t seed,
                                      UpdateDrift& drift);

// recall@10 of the committed new version at `output_path` on
// `recall_queries` rows of `delta` (or of the new version's, when the delta
// has none), against exact search over its INDEX.vectors; nothing without
// INDEX.vectors or with fewer than 10 rows.
absl::Status MeasureUpdateRecall(const std::string& output_path,
                                 const Matrix* delta, int recall_queries,
                                 uint32_t seed, UpdateDrift& drift);

// Fills drift.retrain_reasons from the figures and the thresholds above.
void JudgeRetrain(UpdateDrift& drift);

// The report's drift and retrain lines ("drift:    ...", "retrain:  ..."),
// as knnctl update prints them.
std::vector<std::string> DescribeDrift(const UpdateDrift& drift);

// knnctl build's trained reference: the rows SampleRowNumbers(rows,
// sample_rows, seed) picks, copied as the build's batches pass by
// (Collect), measured once every row is added (Measure).
class TrainedReferenceSample {
 public:
  TrainedReferenceSample(int64_t rows, int dim,
                         int64_t sample_rows = kDriftSampleRows,
                         uint32_t seed = kDriftSeed);

  // Rows [first, first + n) of the corpus, n * dim floats as read.
  void Collect(int64_t first, int64_t n, const float* values);

  // The reference of `builder` once every row was added: the sample's
  // errors (normalised for cosine by the builder), the list imbalance and
  // ntotal. FAILED_PRECONDITION when rows were not all collected.
  absl::StatusOr<knnd::v1::IndexMetadata::TrainedReference> Measure(
      const IndexBuilder& builder) const;

 private:
  const int dim_;
  const std::vector<int64_t> rows_;  // ascending
  std::vector<float> values_;        // rows_.size() * dim
  size_t collected_ = 0;
};

}  // namespace knnd

#endif  // KNND_INDEX_UPDATE_DRIFT_H_
