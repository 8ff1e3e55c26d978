#include "knnd/index/index_tuning.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/version_manifest.h"

namespace knnd {

double RecallBound(const SweepRow& row, size_t column, double z) {
  const double se = column < row.recall_se.size() ? row.recall_se[column] : 0;
  return row.recall[column] - z * se;
}

const SweepRow* FastestReaching(absl::Span<const SweepRow> rows, size_t column,
                                double target, double z) {
  const SweepRow* fastest = nullptr;
  for (const SweepRow& row : rows) {
    if (RecallBound(row, column, z) >= target &&
        (fastest == nullptr ||
         row.queries_per_second > fastest->queries_per_second)) {
      fastest = &row;
    }
  }
  return fastest;
}

std::vector<int> DefaultNprobeSweep(int64_t nlist) {
  std::vector<int> nprobes;
  for (int64_t p = 1; p < nlist; p *= 2) {
    nprobes.push_back(static_cast<int>(p));
    if (p >= 2 && p + p / 2 < nlist) {
      nprobes.push_back(static_cast<int>(p + p / 2));
    }
  }
  nprobes.push_back(static_cast<int>(std::max<int64_t>(nlist, 1)));
  return nprobes;
}

std::vector<int> DefaultRefineSweep(bool has_vectors) {
  if (!has_vectors) return {0};
  return {0, 1, 2, 3, 4, 6, 8, 12, 16};
}

absl::StatusOr<std::vector<SweepRow>> SweepSettings(
    const MeasuredIndex& index, const Matrix& queries,
    absl::Span<const int64_t> truth, int truth_k, const SettingsSweep& sweep,
    const std::function<void(const SweepRow&)>& measured) {
  SweepOptions options;
  options.k = sweep.k;
  options.recall_at =
      sweep.recall_at.empty() ? std::vector<int>{sweep.k} : sweep.recall_at;
  const auto k_column =
      std::find(options.recall_at.begin(), options.recall_at.end(), sweep.k);
  if (k_column == options.recall_at.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the recall columns leave out recall@k (k=", sweep.k, ")"));
  }
  const size_t column =
      static_cast<size_t>(k_column - options.recall_at.begin());
  options.batch_rows = sweep.batch_rows;
  options.leave_out = sweep.leave_out;
  std::vector<SweepRow> rows;
  for (int refine_factor : sweep.refine_factors) {
    options.refine_factor = refine_factor;
    for (int nprobe : sweep.nprobes) {
      options.nprobes = {nprobe};
      absl::StatusOr<std::vector<SweepRow>> row =
          SweepNprobe(index, queries, truth, truth_k, options);
      if (!row.ok()) return row.status();
      rows.push_back(std::move(row->front()));
      if (measured) measured(rows.back());
      if (sweep.stop_at_recall > 0 &&
          RecallBound(rows.back(), column, sweep.confidence_z) >=
              sweep.stop_at_recall) {
        break;
      }
    }
  }
  return rows;
}

Choice ChooseSetting(absl::Span<const SweepRow> rows, size_t column,
                     double target, double z, double tolerance) {
  Choice choice;
  choice.row = FastestReaching(rows, column, target, z);
  choice.reached = choice.row != nullptr;
  if (choice.reached || rows.empty()) return choice;
  // More nprobe cannot fix what the codes lost: the fastest setting near
  // the best recall.
  double best = rows.front().recall[column];
  for (const SweepRow& row : rows) best = std::max(best, row.recall[column]);
  for (const SweepRow& row : rows) {
    if (row.recall[column] >= best - tolerance &&
        (choice.row == nullptr ||
         row.queries_per_second > choice.row->queries_per_second)) {
      choice.row = &row;
    }
  }
  return choice;
}

absl::StatusOr<TuneResult> TuneSearchDefaults(const MeasuredIndex& index,
                                              const Matrix& queries,
                                              absl::Span<const int64_t> truth,
                                              int truth_k,
                                              const TuneOptions& options) {
  const IndexInfo& info = index.info();
  if (!(options.target_recall > 0 && options.target_recall <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_recall=", options.target_recall, " is outside (0, 1]"));
  }
  if (!(options.confidence_z >= 0 && options.confidence_z <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "confidence_z=", options.confidence_z, " is outside [0, 10]"));
  }
  SettingsSweep sweep;
  sweep.k = options.k;
  sweep.nprobes = options.nprobes.empty() ? DefaultNprobeSweep(info.nlist)
                                          : options.nprobes;
  sweep.refine_factors = options.refine_factors.empty()
                             ? DefaultRefineSweep(info.has_vectors)
                             : options.refine_factors;
  sweep.leave_out = options.leave_out;
  sweep.stop_at_recall = options.target_recall;
  sweep.confidence_z = options.confidence_z;
  absl::StatusOr<std::vector<SweepRow>> measured =
      SweepSettings(index, queries, truth, truth_k, sweep);
  if (!measured.ok()) return measured.status();
  if (measured->empty()) {
    return absl::InvalidArgumentError(
        "no setting to measure: the nprobe or refine_factor list is empty");
  }
  TuneResult result;
  result.measured = std::move(*measured);
  const Choice choice =
      ChooseSetting(result.measured, 0, options.target_recall,
                    options.confidence_z, /*tolerance=*/0);
  result.reached = choice.reached;
  result.chosen = *choice.row;
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
  return RewriteSidecar(index_path, *meta, "knnctl tune");
}

Matrix SampleRows(const Matrix& base, int64_t count, uint32_t seed,
                  std::vector<int64_t>* rows) {
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
  if (rows != nullptr) {
    rows->assign(order.begin(), order.begin() + sample.rows);
  }
  return sample;
}

}  // namespace knnd
