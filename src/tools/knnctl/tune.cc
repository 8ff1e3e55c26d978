// knnctl tune: measures (nprobe, refine_factor) settings on held-out
// queries through IndexSnapshot, one query per call, and stores the fastest
// that reaches --target_recall in the index's sidecar, where knnd takes its
// defaults from when the config leaves them unset. A shard set (--shards)
// is measured as one, its shards searched and merged as a front merges
// them, and the one decision is stored in every shard's sidecar.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "command.h"
#include "knnd/base/metric.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_sharding.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/index_tuning.h"
#include "knnd/index/shard_set_search.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/vectors_file.h"

namespace knnd::knnctl {
namespace {

struct TuneFlags {
  std::string index;
  int shards = 0;
  QueryOptions query;
  std::string base;
  int64_t sample = 1000;
  double target_recall = 0.95;
  double confidence_z = 1.645;
  std::string nprobes;
  std::string refine_factors;
  bool dry_run = false;
};

// What is tuned: one index, or a shard set searched as one; the index
// files whose sidecars receive the decision, with their vector counts.
struct Tuned {
  std::unique_ptr<IndexSnapshot> snapshot;
  std::unique_ptr<ShardSetSearch> set;
  std::unique_ptr<MeasuredIndex> measured;  // over `snapshot`
  std::vector<std::pair<std::string, int64_t>> files;

  const MeasuredIndex& index() const {
    return set != nullptr ? static_cast<const MeasuredIndex&>(*set)
                          : *measured;
  }
};

// Loads --index, or with --shards N the set --index.shard-S-of-N. A shard
// alone is refused: its own defaults would differ from its siblings', and
// a front (or ShardedKnnClient) refuses answers whose shards disagree.
absl::StatusOr<Tuned> LoadTuned(const TuneFlags& flags) {
  LoadOptions load;
  Tuned tuned;
  if (flags.shards > 0) {
    absl::StatusOr<std::unique_ptr<ShardSetSearch>> set =
        ShardSetSearch::Load(flags.index, flags.shards, load);
    if (!set.ok()) return set.status();
    tuned.set = std::move(*set);
    for (int s = 0; s < tuned.set->count(); ++s) {
      tuned.files.emplace_back(tuned.set->shard_path(s),
                               tuned.set->shard(s).info().ntotal);
    }
    return tuned;
  }
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
      IndexSnapshot::Load(flags.index, load);
  if (!snapshot.ok()) return snapshot.status();
  const IndexInfo& info = (*snapshot)->info();
  if (info.shard_count > 0) {
    const std::string suffix =
        ShardPath("", info.shard_id, info.shard_count);
    const std::string set_path =
        absl::EndsWith(flags.index, suffix)
            ? flags.index.substr(0, flags.index.size() - suffix.size())
            : "OUT";
    return absl::FailedPreconditionError(absl::StrCat(
        flags.index, " is shard ", info.shard_id, " of ", info.shard_count,
        " (build ", info.build_id, "): tuned alone it would record defaults "
        "of its own, and a front (or ShardedKnnClient) refuses the answers of "
        "shards that serve different ones. Tune the set as one: knnctl tune "
        "--index ", set_path, " --shards ", info.shard_count,
        " (docs/sharding.md, \"Tuning\")"));
  }
  tuned.snapshot = std::move(*snapshot);
  tuned.measured = std::make_unique<MeasuredSnapshot>(*tuned.snapshot);
  tuned.files.emplace_back(flags.index, info.ntotal);
  return tuned;
}

// The indexed vectors from the re-ranking vectors files of `files`, in
// order, as floats: a set's rows in shard order.
absl::StatusOr<Matrix> ReadIndexedVectors(
    const std::vector<std::pair<std::string, int64_t>>& files, int dim) {
  Matrix m;
  m.dim = dim;
  for (const auto& [path, ntotal] : files) {
    absl::StatusOr<std::unique_ptr<VectorsFile>> vectors = VectorsFile::Open(
        VectorsPath(path), dim, ntotal, /*verify_checksum=*/false);
    if (!vectors.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tune needs the indexed vectors for exact neighbours: --base FILE, "
          "or ", VectorsPath(path), " (", vectors.status().message(), ")"));
    }
    const size_t first = m.values.size();
    m.values.resize(first + static_cast<size_t>(ntotal) * dim);
    for (int64_t i = 0; i < ntotal; ++i) {
      float* out = m.values.data() + first + i * dim;
      const float* row = (*vectors)->RowAsFloats(i, out);
      if (row != out) std::copy(row, row + dim, out);
    }
    m.rows += ntotal;
  }
  return m;
}

// "A.meta.json, B.meta.json".
std::string Sidecars(
    const std::vector<std::pair<std::string, int64_t>>& files) {
  std::vector<std::string> names;
  for (const auto& file : files) names.push_back(MetadataPath(file.first));
  return absl::StrJoin(names, ", ");
}

int Tune(const TuneFlags& flags) {
  if (flags.index.empty()) return Fail("tune needs --index INDEX");
  absl::StatusOr<Tuned> tuned = LoadTuned(flags);
  if (!tuned.ok()) return Fail(tuned.status());
  const MeasuredIndex& index = tuned->index();
  const IndexInfo& info = index.info();

  // The base: --base, else the index's own re-ranking vectors files.
  absl::StatusOr<Matrix> base;
  std::string base_name = flags.base;
  if (!flags.base.empty()) {
    base = ReadVectors(flags.base);
  } else {
    base = ReadIndexedVectors(tuned->files, info.dim);
    base_name = tuned->set != nullptr
                    ? absl::StrCat("every shard's vectors file (",
                                   VectorsPath(tuned->files.front().first),
                                   ", ...)")
                    : VectorsPath(flags.index);
  }
  if (!base.ok()) return Fail(base.status());
  if (base->rows != info.ntotal || base->dim != info.dim) {
    return Fail(absl::StrCat(base_name, " holds ", base->rows, " x ",
                             base->dim, " vectors; the index ", info.ntotal,
                             " x ", info.dim));
  }

  // Held-out queries: --queries, else a seeded sample of the base.
  Matrix queries;
  std::vector<int64_t> sampled_rows;  // with sampled queries, their rows
  std::string tuned_on;
  if (!flags.query.queries.empty()) {
    absl::StatusOr<Matrix> read =
        ReadVectors(flags.query.queries, flags.query.limit);
    if (!read.ok()) return Fail(read.status());
    queries = std::move(*read);
    tuned_on = absl::StrCat(queries.rows, " queries of ", flags.query.queries);
  } else {
    queries = SampleRows(*base, flags.sample, 1, &sampled_rows);
    tuned_on = absl::StrCat(queries.rows,
                            " sampled base vectors, each without itself");
  }
  if (tuned->set != nullptr) {
    absl::StrAppend(&tuned_on, "; the ", tuned->set->count(),
                    " shards of build ", info.build_id, " searched as one");
  }
  const int k = flags.query.k;
  if (k < 1 || k > info.ntotal) {
    return Fail(
        absl::StrCat("--k=", k, " must be in [1, ntotal=", info.ntotal, "]"));
  }
  const absl::Time start = absl::Now();
  // A sampled query's own row is left out of its truth and its results
  // (one neighbour more is asked for): it would find itself, and score as
  // no new query can.
  const bool leave_out = !sampled_rows.empty();
  if (leave_out && k + 1 > info.ntotal) {
    return Fail(absl::StrCat("--k=", k, " leaves no other row for a sampled query "
                             "among the ", info.ntotal, " indexed ones"));
  }
  absl::StatusOr<std::vector<int64_t>> truth =
      ExactNeighbors(*base, queries, leave_out ? k + 1 : k, info.metric);
  if (!truth.ok()) return Fail(truth.status());
  RowsToAnswerIds(index, *truth);  // own ids: through the id table
  std::vector<int64_t> own_ids;
  if (leave_out) {
    own_ids = sampled_rows;
    RowsToAnswerIds(index, own_ids);
    *truth = LeaveOut(*truth, k, own_ids);
  }
  std::printf("index:    %s: %s, %lld vectors x %d, metric %s\n",
              flags.index.c_str(), info.index_type.c_str(),
              static_cast<long long>(info.ntotal), info.dim,
              MetricName(info.metric));
  if (tuned->set != nullptr) {
    std::printf("shards:   %d of build %s, each searched in turn and merged "
                "as a front merges them (the unsharded answer)\n",
                tuned->set->count(), info.build_id.c_str());
  }
  std::printf("queries:  %s; exact neighbours from %s in %.1f s\n",
              tuned_on.c_str(), base_name.c_str(),
              absl::ToDoubleSeconds(absl::Now() - start));

  TuneOptions options;
  options.k = k;
  options.target_recall = flags.target_recall;
  options.leave_out = own_ids;
  options.confidence_z = flags.confidence_z;
  // Unset lists leave TuneSearchDefaults its finer default sweeps.
  if (!flags.nprobes.empty()) {
    absl::StatusOr<std::vector<int>> nprobes =
        NprobeList(flags.nprobes, info.nlist);
    if (!nprobes.ok()) return Fail(nprobes.status());
    options.nprobes = *nprobes;
  }
  if (!flags.refine_factors.empty()) {
    absl::StatusOr<std::vector<int>> refine_factors =
        RefineFactorList(flags.refine_factors, info.has_vectors);
    if (!refine_factors.ok()) return Fail(refine_factors.status());
    options.refine_factors = *refine_factors;
  }
  absl::StatusOr<TuneResult> result =
      TuneSearchDefaults(index, queries, *truth, k, options);
  if (!result.ok()) return Fail(result.status());

  std::printf("\n%8s  %6s  %10s  %8s  %10s   (1 thread, 1 query per call; "
              "bound: recall - %.3g standard errors)\n",
              "nprobe", "refine", absl::StrCat("recall@", k).c_str(), "bound",
              "queries/s", flags.confidence_z);
  for (const SweepRow& row : result->measured) {
    std::printf("%8d  %6d  %10.4f  %8.4f  %10.0f\n", row.nprobe,
                row.refine_factor, row.recall[0],
                RecallBound(row, 0, flags.confidence_z),
                row.queries_per_second);
  }
  const SweepRow& chosen = result->chosen;
  std::printf("\n%s: nprobe %d refine_factor %d, recall@%d %.4f (bound "
              "%.4f) at %.0f queries/s\n",
              result->reached
                  ? absl::StrCat("tuned (recall@", k, " >= ",
                                 flags.target_recall, ")")
                        .c_str()
                  : absl::StrCat("target recall@", k, " >= ",
                                 flags.target_recall,
                                 " not reached; most accurate")
                        .c_str(),
              chosen.nprobe, chosen.refine_factor, k, chosen.recall[0],
              RecallBound(chosen, 0, flags.confidence_z),
              chosen.queries_per_second);
  if (flags.dry_run) return kExitOk;
  if (!result->reached) {
    std::printf("%s left as it was: lower --target_recall, widen the sweep "
                "or rebuild with more bytes per vector\n",
                Sidecars(tuned->files).c_str());
    return kExitError;
  }
  // One decision, recorded in every file of the set alike.
  for (size_t i = 0; i < tuned->files.size(); ++i) {
    const std::string& path = tuned->files[i].first;
    if (absl::Status s = RecordTunedDefaults(path, options, *result, tuned_on);
        !s.ok()) {
      if (i == 0) return Fail(s);
      return Fail(absl::StrCat(
          s.message(), "; ", i, " of ", tuned->files.size(),
          " shards recorded the new defaults and the others did not: run "
          "this tune again before serving the set"));
    }
  }
  std::printf("recorded in %s: knnd serves these defaults unless its config "
              "sets default_nprobe or default_refine_factor%s\n",
              Sidecars(tuned->files).c_str(),
              tuned->set != nullptr
                  ? "; every shard alike, so a front (or ShardedKnnClient) "
                    "over them serves them too"
                  : "");
  return kExitOk;
}

}  // namespace

std::function<int()> DefineTune(FlagSet& flags) {
  auto options = std::make_shared<TuneFlags>();
  flags.Add("index", &options->index, "INDEX",
            "Index file to tune (with its sidecar); with --shards, the path "
            "the set's shards are named after. Required.");
  flags.Add("shards", &options->shards, "N",
            "Tune the set INDEX.shard-S-of-N (knnctl build --shards N, "
            "knnctl shard) as one: its shards searched and merged as a "
            "front merges them, one decision recorded in every shard's "
            "sidecar. A shard alone is refused.");
  AddQueryFlags(flags, options->query);
  flags.Add("base", &options->base, "FILE",
            "The indexed vectors, for exact neighbours (a set's: the build's "
            "input, rows in shard order); default the index's re-ranking "
            "vectors file INDEX.vectors (every shard's).");
  flags.Add("sample", &options->sample, "N",
            "Without --queries: this many base vectors (seeded sample) are "
            "the queries.");
  flags.Add("target_recall", &options->target_recall, "R",
            "Recall@k the tuned defaults must reach.");
  flags.Add("confidence_z", &options->confidence_z, "Z",
            "A setting reaches --target_recall when its measured recall less "
            "Z standard errors (over the queries) does: 1.645 is a one-sided "
            "95% bound, so that new queries reach it too; 0: the measured "
            "recall itself.");
  flags.Add("nprobes", &options->nprobes, "LIST",
            "Comma-separated nprobe values; default 1,2,3,4,6,8,12,16,... "
            "(powers of two and 1.5 times them) up to nlist.");
  flags.Add("refine_factors", &options->refine_factors, "LIST",
            "Comma-separated refine_factor values; default "
            "0,1,2,3,4,6,8,12,16 with INDEX.vectors, else 0.");
  flags.AddSwitch("dry_run", &options->dry_run,
                  "Measure and print only; leave the sidecar as it is.");
  return [options] { return Tune(*options); };
}

}  // namespace knnd::knnctl
