// knnctl eval: recall@R and queries/s of an index file for a sweep of
// nprobe (and refine_factor), measured through IndexSnapshot, the daemon's
// own search path, at --k as a request of k neighbours searches, and the
// setting to serve. The sweep and the choice are knnctl tune's
// (index/index_tuning.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "command.h"
#include "eval_relevance.h"
#include "knnd/base/metric.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/index_tuning.h"
#include "knnd/storage/vector_io.h"

namespace knnd::knnctl {
namespace {

struct EvalOptions {
  std::string index;
  QueryOptions query;
  std::string ground_truth;
  std::string base;
  std::string ids;
  double target_recall = 0.95;
  std::string nprobes;
  std::string refine_factors;
  int64_t batch = 256;
  int threads = 0;
  RelevanceOptions relevance;  // --labels: scored against relevance labels
};

// True neighbour ids, `k` per query, closest first.
struct Truth {
  std::vector<int64_t> ids;
  int k = 0;
};

// The R values of the recall columns: 1, 10 and 100 up to --k, and k.
// Every setting is searched at k, as a request of k neighbours is (with
// re-ranking, of refine_factor * k candidates), and recall@R scores the
// first R of those k results.
std::vector<int> RecallColumns(int k) {
  std::vector<int> columns;
  for (int r : {1, 10, 100, k}) {
    if (r <= k) columns.push_back(r);
  }
  std::sort(columns.begin(), columns.end());
  columns.erase(std::unique(columns.begin(), columns.end()), columns.end());
  return columns;
}

// --ground_truth for `rows` queries, with at least k neighbours per query
// (every recall column is <= k).
absl::StatusOr<Truth> TruthFromFile(const std::string& path, int64_t rows,
                                    int k) {
  absl::StatusOr<IdMatrix> read = ReadIds(path);
  if (!read.ok()) return read.status();
  if (read->rows < rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has ", read->rows, " rows for ", rows, " queries"));
  }
  Truth truth;
  truth.k = read->cols;
  truth.ids.assign(read->values.begin(), read->values.begin() + rows * truth.k);
  if (k > truth.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has ", truth.k, " neighbours per query, fewer than --k=", k));
  }
  std::printf("truth:    %s: %d neighbours per query\n", path.c_str(), truth.k);
  return truth;
}

// Exact neighbours of `queries` in --base, k per query, in the ids the
// index answers with: through its id table (own ids), else through --ids
// (an index whose lists hold the ids).
absl::StatusOr<Truth> TruthFromBase(const EvalOptions& options,
                                    const IndexSnapshot& snapshot,
                                    const Matrix& queries, int k) {
  const IndexInfo& info = snapshot.info();
  absl::StatusOr<Matrix> base = ReadVectors(options.base);
  if (!base.ok()) return base.status();
  if (base->rows != info.ntotal) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.base, " has ", base->rows, " rows but the index holds ",
        info.ntotal, "; --base must be the indexed vectors"));
  }
  Truth truth;
  truth.k = k;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<int64_t>> exact =
      ExactNeighbors(*base, queries, truth.k, info.metric);
  if (!exact.ok()) return exact.status();
  truth.ids = std::move(*exact);
  if (info.has_id_table) {
    RowsToAnswerIds(snapshot, truth.ids);
    std::printf("ids:      rows translated by the id table %s%s\n",
                info.id_table_path.c_str(),
                options.ids.empty() ? "" : " (--ids not needed)");
  } else if (!options.ids.empty()) {
    absl::StatusOr<std::vector<int64_t>> ids =
        ReadRowIds(options.ids, base->rows);
    if (!ids.ok()) return ids.status();
    for (int64_t& id : truth.ids) id = (*ids)[id];
  }
  std::printf("truth:    exact %s search over %s (%lld rows), %.1f s\n",
              MetricName(info.metric), options.base.c_str(),
              static_cast<long long>(base->rows),
              absl::ToDoubleSeconds(absl::Now() - start));
  return truth;
}

// Prints the fastest measured setting reaching --target_recall at recall@k
// (column `target_column`), or, when none does, the best recall and the
// fastest setting within 0.005 of it, then the chosen line.
void ReportChoice(const std::vector<SweepRow>& rows, size_t target_column,
                  int k, double target, bool has_vectors) {
  // The measured mean, not tune's confidence bound: eval reports what it
  // measured on these queries.
  const Choice choice = ChooseSetting(rows, target_column, target, /*z=*/0,
                                      /*tolerance=*/0.005);
  const SweepRow* chosen = choice.row;
  std::printf("\n");
  if (choice.reached) {
    std::printf(
        "recall@%d >= %.3g: fastest at nprobe %d refine_factor %d "
        "(%.4f, %.0f queries/s)\n",
        k, target, chosen->nprobe, chosen->refine_factor,
        chosen->recall[target_column], chosen->queries_per_second);
  } else {
    const SweepRow* best = &rows.front();
    for (const SweepRow& row : rows) {
      if (row.recall[target_column] > best->recall[target_column]) best = &row;
    }
    std::printf(
        "no setting reaches recall@%d >= %.3g: the best is %.4f at nprobe %d "
        "refine_factor %d. The PQ codes limit recall: %s\n",
        k, target, best->recall[target_column], best->nprobe,
        best->refine_factor,
        has_vectors
            ? "try larger --refine_factors or rebuild with a larger --m."
            : "rebuild with a larger --m (more bytes per vector), or with "
              "--keep_vectors and re-rank candidates exactly "
              "(--refine_factors).");
  }
  std::printf(
      "chosen nprobe: %d refine_factor: %d (recall@%d %.4f at k=%d); serve "
      "it with default_nprobe: %d and default_refine_factor: %d in the "
      "config, or per request with k=%d; knnctl tune records such a "
      "setting in the sidecar\n",
      chosen->nprobe, chosen->refine_factor, k, chosen->recall[target_column],
      k, chosen->nprobe, chosen->refine_factor, k);
}

int Eval(const EvalOptions& options) {
  UseThreads(options.threads);
  if (!options.relevance.labels.empty()) {
    if (options.index.empty()) return Fail("eval needs --index INDEX");
    if (!options.ground_truth.empty() || !options.base.empty()) {
      return Fail(
          "--labels scores against relevance labels; --ground_truth and "
          "--base score against nearest neighbours: give one or the other");
    }
    return EvalRelevance(options.index, options.query, options.relevance,
                         options.nprobes, options.refine_factors,
                         options.batch);
  }
  if (options.index.empty() || options.query.queries.empty() ||
      (options.ground_truth.empty() == options.base.empty())) {
    return Fail(
        "eval needs --index INDEX --queries FILE and either "
        "--ground_truth FILE or --base FILE (exact search over the "
        "indexed vectors)");
  }
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
      IndexSnapshot::Load(options.index, {});
  if (!snapshot.ok()) return Fail(snapshot.status());
  const IndexInfo& info = (*snapshot)->info();
  absl::StatusOr<Matrix> queries =
      ReadVectors(options.query.queries, options.query.limit);
  if (!queries.ok()) return Fail(queries.status());
  const int k = options.query.k;
  if (k < 1 || k > info.ntotal) {
    return Fail(
        absl::StrCat("--k=", k, " must be in [1, ntotal=", info.ntotal, "]"));
  }
  const std::vector<int> columns = RecallColumns(k);
  absl::StatusOr<std::vector<int>> nprobes =
      NprobeList(options.nprobes, info.nlist);
  if (!nprobes.ok()) return Fail(nprobes.status());
  std::printf("index:    %s: %s, %lld vectors x %d, metric %s\n",
              options.index.c_str(), info.index_type.c_str(),
              static_cast<long long>(info.ntotal), info.dim,
              MetricName(info.metric));
  std::printf("queries:  %s: %lld\n", options.query.queries.c_str(),
              static_cast<long long>(queries->rows));

  absl::StatusOr<Truth> truth =
      options.ground_truth.empty()
          ? TruthFromBase(options, **snapshot, *queries, k)
          : TruthFromFile(options.ground_truth, queries->rows, k);
  if (!truth.ok()) return Fail(truth.status());
  std::fflush(stdout);

  absl::StatusOr<std::vector<int>> refine_factors =
      RefineFactorList(options.refine_factors, info.has_vectors);
  if (!refine_factors.ok()) return Fail(refine_factors.status());
  if (info.has_vectors) {
    std::printf("vectors:  %s (%s): exact re-ranking available\n",
                info.vectors_path.c_str(), info.vectors_dtype.c_str());
  } else if (!info.vectors_error.empty()) {
    std::printf("vectors:  not used: %s\n", info.vectors_error.c_str());
  }

  std::printf("\nsearched at k=%d (--k), as a request of %d neighbours: "
              "re-ranking takes refine_factor x %d candidates\n",
              k, k, k);
  std::printf("%8s  %6s", "nprobe", "refine");
  for (int r : columns)
    std::printf("  %10s", absl::StrCat("recall@", r).c_str());
  std::printf("  %10s\n", "queries/s");
  SettingsSweep sweep;
  sweep.k = k;
  sweep.nprobes = *nprobes;
  sweep.refine_factors = *refine_factors;
  sweep.recall_at = columns;
  sweep.batch_rows = options.batch;
  // Each row shows as soon as it is measured.
  absl::StatusOr<std::vector<SweepRow>> rows = SweepSettings(
      MeasuredSnapshot(**snapshot), *queries, truth->ids, truth->k, sweep,
      [](const SweepRow& row) {
        std::printf("%8d  %6d", row.nprobe, row.refine_factor);
        for (double recall : row.recall) std::printf("  %10.4f", recall);
        std::printf("  %10.0f\n", row.queries_per_second);
        std::fflush(stdout);
      });
  if (!rows.ok()) return Fail(rows.status());
  const size_t target_column =
      std::find(columns.begin(), columns.end(), k) - columns.begin();
  ReportChoice(*rows, target_column, k, options.target_recall,
               info.has_vectors);
  return kExitOk;
}

}  // namespace

std::function<int()> DefineEval(FlagSet& flags) {
  auto options = std::make_shared<EvalOptions>();
  flags.Add("index", &options->index, "INDEX",
            "Index file to measure, loaded as knnd loads it. Required.");
  AddQueryFlags(flags, options->query);
  flags.Add("ground_truth", &options->ground_truth, "FILE",
            "True neighbour ids per query (.ivecs or int .npy, closest "
            "first). Either this or --base.");
  flags.Add("base", &options->base, "FILE",
            "The indexed vectors, for exact ground truth. Either this or "
            "--ground_truth.");
  flags.Add("ids", &options->ids, "FILE",
            "With --base, for an index whose lists hold its ids (built "
            "before id tables): the ids it was built with, to map exact "
            "neighbours to them. An index with an id table (INDEX.ids) "
            "maps them itself.");
  flags.Add("target_recall", &options->target_recall, "R",
            "Report the fastest setting whose recall@k reaches this.");
  flags.Add("nprobes", &options->nprobes, "LIST",
            "Comma-separated nprobe values to sweep; default powers of two "
            "up to nlist.");
  flags.Add("refine_factors", &options->refine_factors, "LIST",
            "Comma-separated refine_factor values to sweep with each nprobe "
            "(0 = no re-ranking); default 0,1,2,4,8,16 when the index has "
            "INDEX.vectors, else 0.");
  flags.Add("batch", &options->batch, "N", "Queries per search call.");
  AddThreadsFlag(flags, &options->threads);
  AddRelevanceFlags(flags, options->relevance);
  return [options] { return Eval(*options); };
}

}  // namespace knnd::knnctl
