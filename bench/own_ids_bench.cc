// own_ids_bench: the cost of own ids (an id table beside the index) against
// row ids, measured on indexes whose lists are identical
// (bench/own_ids_bench.py builds them), in one process so that the ratios
// hold on a shared, noisy machine: for every (nprobe, refine_factor) the
// queries run one per call on one thread, in chunks that alternate between
// the indexes (a rotating order each round), so that a burst of other load
// slows every index alike.
//
//   build/own_ids_bench --indexes rows.index,own.index --queries t10k.gz
//       [--limit 5000] [--settings 8:0,8:4,16:4] [--rounds 5] [--chunk 250]
//
// Exact neighbours come from the first index's INDEX.vectors (flat search),
// translated into each index's ids (RowsToAnswerIds): recall@10 is measured
// in the ids each index answers with.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/storage/vector_io.h"

ABSL_FLAG(std::string, indexes, "", "Comma-separated index files; the first "
          "is the reference of the ratios.");
ABSL_FLAG(std::string, queries, "",
          "Query vectors (any format knnctl reads).");
ABSL_FLAG(int64_t, limit, 5000, "Queries used (the first N).");
ABSL_FLAG(std::string, settings, "8:0,8:4,16:0,16:4,16:8,32:4,32:8",
          "nprobe:refine_factor pairs.");
ABSL_FLAG(int, rounds, 5, "Rounds over all queries per setting.");
ABSL_FLAG(int64_t, chunk, 250, "Queries per turn of one index.");

namespace {

constexpr int kK = 10;

[[noreturn]] void Die(const absl::Status& status) {
  std::fprintf(stderr, "own_ids_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

// The rows of the index's raw-vectors file as a Matrix (the indexed base).
knnd::Matrix BaseOf(const knnd::IndexSnapshot& snapshot) {
  const knnd::IndexInfo& info = snapshot.info();
  absl::StatusOr<std::unique_ptr<knnd::VectorsFile>> file =
      knnd::VectorsFile::Open(info.vectors_path, info.dim, info.ntotal, false);
  if (!file.ok()) Die(file.status());
  knnd::Matrix base;
  base.rows = info.ntotal;
  base.dim = info.dim;
  base.values.resize(static_cast<size_t>(base.rows) * base.dim);
  for (int64_t i = 0; i < base.rows; ++i) {
    float* out = base.values.data() + i * base.dim;
    const float* row = (*file)->RowAsFloats(i, out);
    if (row != out) std::copy(row, row + base.dim, out);
  }
  return base;
}

}  // namespace

int main(int argc, char** argv) {
  knnd::UseBlasKernelsForThisCpu();  // as knnd and knnctl do, first thing
  absl::ParseCommandLine(argc, argv);
  knnd::UseSingleThreadedBlas();
  knnd::SetOpenMpThreadsOfThisThread(1);
  std::vector<std::string> paths =
      absl::StrSplit(absl::GetFlag(FLAGS_indexes), ',', absl::SkipEmpty());
  if (paths.empty()) Die(absl::InvalidArgumentError("--indexes is empty"));
  absl::StatusOr<knnd::Matrix> queries = knnd::ReadVectors(
      absl::GetFlag(FLAGS_queries), absl::GetFlag(FLAGS_limit));
  if (!queries.ok()) Die(queries.status());
  std::vector<std::unique_ptr<knnd::IndexSnapshot>> snapshots;
  for (const std::string& path : paths) {
    knnd::LoadOptions load;
    load.vectors = knnd::VectorsPolicy::kRequired;
    load.probe_in_subprocess = false;  // files this run just built
    auto snapshot = knnd::IndexSnapshot::Load(path, load);
    if (!snapshot.ok()) Die(snapshot.status());
    snapshots.push_back(std::move(*snapshot));
  }
  absl::StatusOr<std::vector<int64_t>> rows = knnd::ExactNeighbors(
      BaseOf(*snapshots[0]), *queries, kK, snapshots[0]->info().metric);
  if (!rows.ok()) Die(rows.status());
  std::vector<std::vector<int64_t>> truth;
  for (const auto& snapshot : snapshots) {
    truth.push_back(*rows);
    knnd::RowsToAnswerIds(*snapshot, truth.back());
  }

  std::printf("# own_ids_bench  %s\n", knnd::BuildInfoLine().c_str());
  std::printf("# %lld queries, k=%d, 1 thread, 1 query per call; %d rounds, "
              "%lld queries per turn, order rotating\n\n",
              static_cast<long long>(queries->rows), kK,
              absl::GetFlag(FLAGS_rounds),
              static_cast<long long>(absl::GetFlag(FLAGS_chunk)));
  std::printf("| nprobe | refine |");
  for (const std::string& path : paths) {
    const std::string name = path.substr(path.rfind('/') + 1);
    std::printf(" %s recall@10 | q/s |", name.c_str());
  }
  std::printf("\n|---|---|");
  for (size_t i = 0; i < paths.size(); ++i) std::printf("---|---|");
  std::printf("\n");
  const int64_t nq = queries->rows;
  const int64_t chunk = std::max<int64_t>(1, absl::GetFlag(FLAGS_chunk));
  const size_t n = snapshots.size();
  std::vector<double> log_ratio_sum(n, 0.0);
  int settings = 0;
  for (absl::string_view setting :
       absl::StrSplit(absl::GetFlag(FLAGS_settings), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> parts = absl::StrSplit(setting, ':');
    int nprobe = 0, refine = 0;
    if (!absl::SimpleAtoi(parts.first, &nprobe) ||
        !absl::SimpleAtoi(parts.second, &refine)) {
      Die(absl::InvalidArgumentError("--settings: bad pair"));
    }
    std::vector<std::vector<int64_t>> ids(
        n, std::vector<int64_t>(static_cast<size_t>(nq) * kK));
    std::vector<float> distances(static_cast<size_t>(kK));
    std::vector<absl::Duration> spent(n);
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      for (int64_t begin = 0; begin < nq; begin += chunk) {
        const int64_t end = std::min(nq, begin + chunk);
        for (size_t turn = 0; turn < n; ++turn) {
          const size_t v = (turn + r + begin / chunk) % n;
          const absl::Time start = absl::Now();
          for (int64_t q = begin; q < end; ++q) {
            knnd::SearchArgs args;
            args.queries = queries->row(q);
            args.num_queries = 1;
            args.k = kK;
            args.nprobe = nprobe;
            args.refine_factor = refine;
            args.distances = distances.data();
            args.ids = ids[v].data() + q * kK;
            if (absl::Status s = snapshots[v]->Search(args); !s.ok()) Die(s);
          }
          spent[v] += absl::Now() - start;
        }
      }
    }
    std::printf("| %d | %d |", nprobe, refine);
    const double total = static_cast<double>(nq) * absl::GetFlag(FLAGS_rounds);
    for (size_t v = 0; v < n; ++v) {
      const double qps = total / absl::ToDoubleSeconds(spent[v]);
      const double ratio = absl::ToDoubleSeconds(spent[0]) /
                           absl::ToDoubleSeconds(spent[v]);
      log_ratio_sum[v] += std::log(ratio);
      std::printf(" %.4f | %.0f%s |",
                  knnd::RecallAt(ids[v], kK, truth[v], kK, kK), qps,
                  v == 0 ? "" : absl::StrFormat(" (%.3f)", ratio).c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
    ++settings;
  }
  std::printf("\n");
  for (size_t v = 1; v < n; ++v) {
    std::printf("%s: queries/s %.3fx %s (geometric mean over %d settings)\n",
                paths[v].c_str(), std::exp(log_ratio_sum[v] / settings),
                paths[0].c_str(), settings);
  }
  return 0;
}
