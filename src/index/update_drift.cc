#include "knnd/index/update_drift.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "knnd/faiss/exact_scan.h"
#include "knnd/faiss/fastscan_update.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/vectors_file_reader.h"

namespace knnd {
namespace {

constexpr int kRecallK = 10;

// The rows of a matrix or a vectors file as one row-major float matrix.
absl::StatusOr<Matrix> Gather(
    int dim, const std::vector<int64_t>& rows,
    const std::function<absl::StatusOr<const float*>(int64_t)>& row_of) {
  Matrix out;
  out.rows = static_cast<int64_t>(rows.size());
  out.dim = dim;
  out.values.resize(rows.size() * static_cast<size_t>(dim));
  for (size_t i = 0; i < rows.size(); ++i) {
    absl::StatusOr<const float*> row = row_of(rows[i]);
    if (!row.ok()) return row.status();
    std::copy(*row, *row + dim, out.values.data() + i * dim);
  }
  return out;
}

// Sampled rows of a vectors file, one pread each (not a window: the rows
// are far apart), never through its mapping.
absl::StatusOr<Matrix> GatherFromFile(const VectorsFile& file,
                                      const std::vector<int64_t>& rows) {
  absl::StatusOr<std::unique_ptr<VectorsFileReader>> reader =
      VectorsFileReader::Open(file);
  if (!reader.ok()) return reader.status();
  return Gather(file.dim(), rows,
                [&reader](int64_t r) { return (*reader)->ReadRows(r, 1); });
}

// The exact k nearest rows of `file` for every query (closest first, equal
// distances by lower row; -1 past the rows), scanned a VectorsFileReader
// window at a time: the file is never copied whole, nor its pages kept in
// the process's RSS through its mapping.
absl::StatusOr<std::vector<int64_t>> ExactNeighborsInFile(
    const VectorsFile& file, const Matrix& queries, int k, Metric metric) {
  absl::StatusOr<std::unique_ptr<VectorsFileReader>> reader =
      VectorsFileReader::Open(file);
  if (!reader.ok()) return reader.status();
  ExactScan scan(queries.values.data(), queries.rows, file.dim(), k, metric);
  const int64_t window = (*reader)->window_rows();
  for (int64_t begin = 0; begin < file.count(); begin += window) {
    const int64_t n = std::min(window, file.count() - begin);
    absl::StatusOr<const float*> rows = (*reader)->ReadRows(begin, n);
    if (!rows.ok()) return rows.status();
    scan.Add(*rows, n);
  }
  return scan.ids();
}

// "0.123 -> 0.130 (1.06x)", or `missing` when the side before is 0.
std::string Moved(double before, double after, const char* missing) {
  if (before <= 0) return missing;
  return absl::StrFormat("%.4g -> %.4g (%.2fx)", before, after, after / before);
}

}  // namespace

double ListImbalance(const std::vector<int64_t>& sizes) {
  double sum = 0;
  double squares = 0;
  for (int64_t n : sizes) {
    sum += static_cast<double>(n);
    squares += static_cast<double>(n) * static_cast<double>(n);
  }
  return sum > 0 ? static_cast<double>(sizes.size()) * squares / (sum * sum)
                 : 0;
}

// Selection sampling: one pass, only the sample held.
std::vector<int64_t> SampleRowNumbers(int64_t rows, int64_t count,
                                      uint32_t seed) {
  count = std::min(count, rows);
  std::vector<int64_t> sample;
  sample.reserve(static_cast<size_t>(std::max<int64_t>(0, count)));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  for (int64_t i = 0; i < rows && static_cast<int64_t>(sample.size()) < count;
       ++i) {
    const double need = static_cast<double>(count - sample.size());
    if (uniform(rng) * static_cast<double>(rows - i) < need) {
      sample.push_back(i);
    }
  }
  return sample;
}

void CarryTrainedReference(const UpdatePlan& plan,
                           knnd::v1::IndexMetadata& metadata,
                           UpdateDrift& drift) {
  drift.has_trained = metadata.has_trained();
  if (!drift.has_trained) {
    metadata.clear_rows_added_since_training();
    metadata.clear_rows_deleted_since_training();
    return;
  }
  drift.trained = metadata.trained();
  // An upsert's new vector was encoded without training like an
  // addition's; the row count it leaves alone.
  drift.rows_added_since_training =
      metadata.rows_added_since_training() + plan.added + plan.upserted;
  drift.rows_deleted_since_training =
      metadata.rows_deleted_since_training() + plan.deleted;
  metadata.set_rows_added_since_training(drift.rows_added_since_training);
  metadata.set_rows_deleted_since_training(drift.rows_deleted_since_training);
}

absl::Status MeasureQuantizationDrift(const FastScanUpdate& update,
                                      const IndexInfo& base,
                                      const Matrix* delta,
                                      absl::Span<const int64_t> new_row_of_base,
                                      int64_t sample_rows, uint32_t seed,
                                      UpdateDrift& drift) {
  drift.base_imbalance = ListImbalance(update.BaseListSizes());
  drift.new_imbalance = ListImbalance(update.NewListSizes(new_row_of_base));
  if (base.has_vectors) {
    absl::StatusOr<std::unique_ptr<VectorsFile>> vectors = VectorsFile::Open(
        base.vectors_path, base.dim, base.ntotal, /*verify_checksum=*/false);
    if (!vectors.ok()) return vectors.status();
    absl::StatusOr<Matrix> sample = GatherFromFile(
        **vectors, SampleRowNumbers(base.ntotal, sample_rows, seed));
    if (!sample.ok()) return sample.status();
    absl::StatusOr<QuantizationError> error =
        update.MeasureError(sample->values.data(), sample->rows);
    if (!error.ok()) return error.status();
    drift.base_coarse_error = error->coarse;
    drift.base_pq_error = error->pq;
  }
  if (delta != nullptr && delta->rows > 0) {
    absl::StatusOr<Matrix> sample =
        Gather(base.dim, SampleRowNumbers(delta->rows, sample_rows, seed),
               [delta](int64_t r) -> absl::StatusOr<const float*> {
                 return delta->row(r);
               });
    if (!sample.ok()) return sample.status();
    absl::StatusOr<QuantizationError> error =
        update.MeasureError(sample->values.data(), sample->rows);
    if (!error.ok()) return error.status();
    drift.new_coarse_error = error->coarse;
    drift.new_pq_error = error->pq;
  }
  return absl::OkStatus();
}

absl::Status MeasureUpdateRecall(const std::string& output_path,
                                 const Matrix* delta, int recall_queries,
                                 uint32_t seed, UpdateDrift& drift) {
  LoadOptions load;
  load.probe_in_subprocess = false;
  load.verify_checksum = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(output_path, load);
  if (!loaded.ok()) return loaded.status();
  const IndexSnapshot& snapshot = **loaded;
  const IndexInfo& info = snapshot.info();
  if (!info.has_vectors || info.ntotal < kRecallK) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<VectorsFile>> vectors = VectorsFile::Open(
      info.vectors_path, info.dim, info.ntotal, /*verify_checksum=*/false);
  if (!vectors.ok()) return vectors.status();
  const bool from_delta = delta != nullptr && delta->rows > 0;
  const std::vector<int64_t> rows = SampleRowNumbers(
      from_delta ? delta->rows : info.ntotal, recall_queries, seed + 1);
  absl::StatusOr<Matrix> gathered =
      from_delta ? Gather(info.dim, rows,
                          [delta](int64_t r) -> absl::StatusOr<const float*> {
                            return delta->row(r);
                          })
                 : GatherFromFile(**vectors, rows);
  if (!gathered.ok()) return gathered.status();
  const Matrix& queries = *gathered;
  absl::StatusOr<std::vector<int64_t>> truth =
      ExactNeighborsInFile(**vectors, queries, kRecallK, info.metric);
  if (!truth.ok()) return truth.status();
  RowsToAnswerIds(snapshot, *truth);
  SweepOptions sweep;
  drift.recall_nprobe = static_cast<int>(std::min<int64_t>(
      info.nlist,
      info.tuned_nprobe > 0 ? info.tuned_nprobe : info.stored_nprobe));
  drift.recall_refine_factor =
      info.tuned_nprobe > 0 ? info.tuned_refine_factor : 0;
  sweep.nprobes = {drift.recall_nprobe};
  sweep.k = kRecallK;
  sweep.recall_at = {kRecallK};
  sweep.refine_factor = drift.recall_refine_factor;
  absl::StatusOr<std::vector<SweepRow>> measured =
      SweepNprobe(snapshot, queries, *truth, kRecallK, sweep);
  if (!measured.ok()) return measured.status();
  drift.recall = measured->front().recall.front();
  drift.recall_queries = queries.rows;
  drift.tuned_recall = info.tuned_recall;
  return absl::OkStatus();
}

void JudgeRetrain(UpdateDrift& drift) {
  auto ratio_reason = [&drift](const char* what, const char* of, double ref,
                               double now, double limit) {
    if (ref > 0 && now > limit * ref) {
      drift.retrain_reasons.push_back(
          absl::StrFormat("the new vectors' %s is %.2fx %s (over %.2fx)", what,
                          now / ref, of, limit));
    }
  };
  auto imbalance_reason = [&drift](const char* of, double ref) {
    if (ref > 0 && drift.new_imbalance > kRetrainImbalanceRatio * ref) {
      drift.retrain_reasons.push_back(
          absl::StrFormat("list imbalance %.2f is %.2fx %s %.2f (over %.2fx)",
                          drift.new_imbalance, drift.new_imbalance / ref, of,
                          ref, kRetrainImbalanceRatio));
    }
  };
  ratio_reason("coarse quantization error", "the base's",
               drift.base_coarse_error, drift.new_coarse_error,
               kRetrainErrorRatio);
  ratio_reason("PQ error", "the base's", drift.base_pq_error,
               drift.new_pq_error, kRetrainErrorRatio);
  imbalance_reason("the base's", drift.base_imbalance);
  if (drift.has_trained) {
    const auto& t = drift.trained;
    ratio_reason("coarse quantization error", "the trained reference's",
                 t.coarse_error(), drift.new_coarse_error, kRetrainErrorRatio);
    ratio_reason("PQ error", "the trained reference's", t.pq_error(),
                 drift.new_pq_error, kRetrainErrorRatio);
    imbalance_reason("the trained", t.list_imbalance());
    const int64_t changed =
        drift.rows_added_since_training + drift.rows_deleted_since_training;
    if (t.ntotal() > 0 &&
        static_cast<double>(changed) >
            kRetrainChangedFraction * static_cast<double>(t.ntotal())) {
      drift.retrain_reasons.push_back(absl::StrFormat(
          "%d rows added and %d deleted since training: %.1f%% of the %d "
          "trained on (over %.1f%%)",
          drift.rows_added_since_training, drift.rows_deleted_since_training,
          100.0 * static_cast<double>(changed) /
              static_cast<double>(t.ntotal()),
          t.ntotal(), 100 * kRetrainChangedFraction));
    }
  }
  if (drift.tuned_recall > 0 && drift.recall >= 0 &&
      drift.recall < drift.tuned_recall - kRetrainRecallDrop) {
    drift.retrain_reasons.push_back(absl::StrFormat(
        "recall@10 %.3f is below the tuned %.3f by more than %.2f",
        drift.recall, drift.tuned_recall, kRetrainRecallDrop));
  }
}

std::vector<std::string> DescribeDrift(const UpdateDrift& d) {
  constexpr char kNoBaseSample[] =
      "n/a (the base has no INDEX.vectors to sample)";
  constexpr char kNoTrained[] = "n/a (the build sampled no rows)";
  std::vector<std::string> lines;
  const auto& t = d.trained;
  if (d.new_pq_error > 0 || d.new_coarse_error > 0) {
    lines.push_back(absl::StrCat(
        "drift:    coarse error (base sample -> delta) ",
        Moved(d.base_coarse_error, d.new_coarse_error, kNoBaseSample)));
    if (d.has_trained) {
      lines.push_back(absl::StrCat(
          "drift:    coarse error (trained -> delta) ",
          Moved(t.coarse_error(), d.new_coarse_error, kNoTrained)));
    }
    lines.push_back(
        absl::StrCat("drift:    PQ error (base sample -> delta) ",
                     Moved(d.base_pq_error, d.new_pq_error, kNoBaseSample)));
    if (d.has_trained) {
      lines.push_back(
          absl::StrCat("drift:    PQ error (trained -> delta) ",
                       Moved(t.pq_error(), d.new_pq_error, kNoTrained)));
    }
  }
  lines.push_back(absl::StrCat(
      "drift:    list imbalance (base -> new) ",
      Moved(d.base_imbalance, d.new_imbalance, "n/a (an empty base)")));
  if (d.has_trained) {
    lines.push_back(absl::StrCat(
        "drift:    list imbalance (trained -> new) ",
        Moved(t.list_imbalance(), d.new_imbalance, "n/a (an empty build)")));
    const int64_t changed =
        d.rows_added_since_training + d.rows_deleted_since_training;
    lines.push_back(absl::StrFormat(
        "drift:    since training: %d rows added, %d deleted (%.1f%% of the "
        "%d trained on; retrain past %.1f%%)",
        d.rows_added_since_training, d.rows_deleted_since_training,
        t.ntotal() > 0 ? 100.0 * static_cast<double>(changed) /
                             static_cast<double>(t.ntotal())
                       : 0.0,
        t.ntotal(), 100 * kRetrainChangedFraction));
  } else {
    lines.push_back(
        "drift:    no trained reference in the base's sidecar (built "
        "before knnctl build recorded one, or converted): compared with "
        "the base only, so a slow drift over many updates shows in recall "
        "and imbalance alone");
  }
  if (d.recall >= 0) {
    lines.push_back(absl::StrFormat(
        "drift:    recall@10 %.3f on %d sampled rows at nprobe %d, "
        "refine_factor %d%s",
        d.recall, d.recall_queries, d.recall_nprobe, d.recall_refine_factor,
        d.tuned_recall > 0 ? absl::StrFormat(" (tuned: %.3f)", d.tuned_recall)
                           : " (never tuned: knnctl tune records a target)"));
  }
  if (d.retrain_reasons.empty()) {
    lines.push_back("retrain:  not due");
  } else {
    for (const std::string& why : d.retrain_reasons) {
      lines.push_back(absl::StrCat("retrain:  DUE: ", why));
    }
    lines.push_back(
        "retrain:  rebuild with knnctl build from the whole corpus");
  }
  return lines;
}

TrainedReferenceSample::TrainedReferenceSample(int64_t rows, int dim,
                                               int64_t sample_rows,
                                               uint32_t seed)
    : dim_(dim), rows_(SampleRowNumbers(rows, sample_rows, seed)) {
  values_.resize(rows_.size() * static_cast<size_t>(dim));
}

void TrainedReferenceSample::Collect(int64_t first, int64_t n,
                                     const float* values) {
  while (collected_ < rows_.size() && rows_[collected_] < first + n) {
    const int64_t row = rows_[collected_];
    if (row >= first) {
      std::copy(values + (row - first) * dim_,
                values + (row - first + 1) * dim_,
                values_.data() + collected_ * dim_);
    }
    ++collected_;
  }
}

absl::StatusOr<knnd::v1::IndexMetadata::TrainedReference>
TrainedReferenceSample::Measure(const IndexBuilder& builder) const {
  if (collected_ != rows_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the trained reference's sample holds ", collected_,
                     " of its ", rows_.size(), " rows"));
  }
  absl::StatusOr<QuantizationError> error =
      builder.MeasureError(values_.data(), static_cast<int64_t>(rows_.size()));
  if (!error.ok()) return error.status();
  knnd::v1::IndexMetadata::TrainedReference reference;
  reference.set_coarse_error(error->coarse);
  reference.set_pq_error(error->pq);
  reference.set_sample_rows(static_cast<int64_t>(rows_.size()));
  reference.set_list_imbalance(ListImbalance(builder.ListSizes()));
  reference.set_ntotal(builder.ntotal());
  return reference;
}

}  // namespace knnd
