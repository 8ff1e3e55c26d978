// filter_plans_bench: what one filtered query costs knnd in process under
// each plan, beside the unfiltered search of the same queries, so that the
// ratios hold on a shared, noisy machine (no client, no gRPC: the search
// alone, caches warm).
//
//   build/bench/filter_plans_bench --index WITH_ATTRS.index --base BASE.npy
//       --queries Q.npy [--field u] [--below 1000] [--limit 400]
//       [--nprobe 0] [--refine -1] [--rounds 3] [--batch 1]
//       [--only unfiltered|bitmap|lists|flat]
//
// The filter is {field < below} on an integer attribute (bench/filter_bench.py
// builds such an index: u uniform in [0, 100000)), compiled once as knnd's
// handler compiles a kept filter, with its lists where the snapshot keeps
// them. Per round, in turns, the queries --batch per call (one by default):
// unfiltered; the bitmap alone (a filter first seen); the bitmap with its
// lists (a kept filter); and the lists through the flat plan (where the
// codes are not residuals), each planned by IndexSnapshot as knnd plans
// it; --only runs one of them (e.g. under perf record). Prints us per
// query (median over the rounds), the plan, and recall@10 against an
// exact search of the matching rows of --base.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/faiss/filtered_lists.h"
#include "knnd/faiss/search_args.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/filter_planner.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/storage/vector_io.h"
#include "knnd/v1/knn_service.pb.h"

ABSL_FLAG(std::string, index, "", "Index file with INDEX.attrs and .vectors.");
ABSL_FLAG(std::string, queries, "", "Query vectors (any format knnctl reads).");
ABSL_FLAG(std::string, base, "",
          "The index's input vectors (the exact answers among the matches).");
ABSL_FLAG(std::string, field, "u", "Integer attribute the filter tests.");
ABSL_FLAG(int64_t, below, 1000, "The filter admits field < below.");
ABSL_FLAG(int64_t, limit, 400, "Queries used (the first N).");
ABSL_FLAG(int, nprobe, 0,
          "nprobe; 0: the index's tuned one (knnctl tune), else its stored.");
ABSL_FLAG(int, refine, -1,
          "refine_factor; -1: the index's tuned one, else 0.");
ABSL_FLAG(int, rounds, 3, "Rounds of every case in turn.");
ABSL_FLAG(int64_t, batch, 1,
          "Queries per search call (knnd's handler passes a request's "
          "rows, up to its batch limit, in one call).");
ABSL_FLAG(std::string, only, "",
          "Run this case alone (unfiltered, bitmap, lists, flat): e.g. "
          "under perf record.");

namespace {

constexpr int kK = 10;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "filter_plans_bench: %s\n", message.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  knnd::UseBlasKernelsForThisCpu();  // as knnd and knnctl do, first thing
  absl::ParseCommandLine(argc, argv);
  knnd::UseSingleThreadedBlas();
  knnd::SetOpenMpThreadsOfThisThread(1);
  knnd::LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = knnd::IndexSnapshot::Load(absl::GetFlag(FLAGS_index), options);
  if (!loaded.ok()) Die(loaded.status().ToString());
  const knnd::IndexSnapshot& snapshot = **loaded;
  const knnd::IndexInfo& info = snapshot.info();
  auto read = knnd::ReadVectors(absl::GetFlag(FLAGS_queries));
  if (!read.ok()) Die(read.status().ToString());
  if (read->dim != info.dim) Die("queries' dim is not the index's");
  if (info.metric == knnd::Metric::kCosine) {
    Die("a cosine index: the exact answers here are for L2 and inner product");
  }
  const int64_t nq = std::min<int64_t>(absl::GetFlag(FLAGS_limit), read->rows);
  const int nprobe =
      absl::GetFlag(FLAGS_nprobe) > 0 ? absl::GetFlag(FLAGS_nprobe)
      : info.tuned_nprobe > 0         ? info.tuned_nprobe
                                      : info.stored_nprobe;
  const int refine = absl::GetFlag(FLAGS_refine) >= 0
                         ? absl::GetFlag(FLAGS_refine)
                         : info.tuned_refine_factor;

  knnd::v1::Filter filter;
  knnd::v1::Condition* condition = filter.mutable_condition();
  condition->set_field(absl::GetFlag(FLAGS_field));
  condition->mutable_range()->mutable_lt()->set_int_value(
      absl::GetFlag(FLAGS_below));
  auto rows = snapshot.CompileFilter(filter, {}, knnd::FilterLimits{});
  if (!rows.ok()) Die(rows.status().ToString());
  const int64_t matched = rows->Count();
  const std::shared_ptr<const knnd::FilteredLists> lists =
      snapshot.FilterLists(*rows, matched);
  const auto shared_rows = std::make_shared<const knnd::RowBitmap>(*rows);

  // Exact neighbours among the matching rows (from --base, the build's
  // input, row i the index's row i), as ids.
  auto base = knnd::ReadVectors(absl::GetFlag(FLAGS_base));
  if (!base.ok()) Die(base.status().ToString());
  if (base->rows != info.ntotal || base->dim != info.dim) {
    Die("--base is not the index's input (rows or dim differ)");
  }
  std::vector<int64_t> matching;
  std::vector<float> matching_rows;
  for (int64_t row = 0; row < info.ntotal; ++row) {
    if (!rows->Test(row)) continue;
    matching.push_back(snapshot.IdOfRow(row));
    matching_rows.insert(matching_rows.end(), base->row(row),
                         base->row(row) + info.dim);
  }
  base->values = {};
  std::vector<int64_t> truth(nq * kK, -1);
  {
    std::vector<float> exact_distances(nq * kK);
    if (absl::Status s = knnd::ExactKnn(
            matching_rows.data(), static_cast<int64_t>(matching.size()),
            read->values.data(), nq, info.dim, kK, info.metric,
            exact_distances.data(), truth.data());
        !s.ok()) {
      Die(s.ToString());
    }
    for (int64_t& t : truth) {
      if (t >= 0) t = matching[static_cast<size_t>(t)];
    }
  }

  // Each filtered case is planned by the snapshot as knnd's handler has it
  // planned (the bitmap alone: a filter first seen; with its lists: a kept
  // one), except "flat" which asks for the flat plan.
  struct Case {
    const char* name;
    bool filtered;
    bool with_lists;
    bool flat;
    std::vector<double> us;
    double recall = 0;
    knnd::FilterPlan plan = knnd::FilterPlan::kIvf;
  };
  std::vector<Case> cases = {{"unfiltered", false, false, false, {}},
                             {"bitmap", true, false, false, {}},
                             {"lists", true, true, false, {}},
                             {"flat", true, true, true, {}}};
  const std::string only = absl::GetFlag(FLAGS_only);
  if (!only.empty() &&
      std::none_of(cases.begin(), cases.end(),
                   [&](const Case& c) { return only == c.name; })) {
    Die("--only: no case " + only + " (unfiltered, bitmap, lists, flat)");
  }
  const bool flat_possible = lists != nullptr && !info.by_residual;

  const int64_t batch = std::max<int64_t>(absl::GetFlag(FLAGS_batch), 1);
  std::vector<float> distances(batch * kK);
  std::vector<int64_t> ids(nq * kK);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (Case& c : cases) {
      if (c.with_lists && lists == nullptr) continue;
      if (c.flat && !flat_possible) continue;
      if (!only.empty() && only != c.name) continue;
      knnd::SearchArgs args;
      args.k = kK;
      args.nprobe = nprobe;
      args.refine_factor = refine;
      args.distances = distances.data();
      // Each case's plan as the handler prepares it, or the flat plan
      // forced.
      std::optional<knnd::PreparedFilter> prepared;
      if (c.filtered) {
        prepared = knnd::PrepareRows(snapshot, shared_rows,
                                     c.with_lists ? lists : nullptr,
                                     {batch, kK, nprobe, refine});
        if (c.flat) prepared->plan = knnd::FilterPlan::kFlat;
        c.plan = prepared->plan;
      }
      const absl::Time start = absl::Now();
      for (int64_t q = 0; q < nq; q += batch) {
        args.num_queries = std::min(batch, nq - q);
        args.queries = read->values.data() + q * info.dim;
        args.ids = ids.data() + q * kK;
        if (absl::Status s = snapshot.Search(
                args, prepared.has_value() ? &*prepared : nullptr);
            !s.ok()) {
          Die(s.ToString());
        }
      }
      c.us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) /
                     static_cast<double>(nq));
      if (round == 0) {
        int64_t hits = 0;
        for (int64_t q = 0; q < nq; ++q) {
          for (int j = 0; j < kK; ++j) {
            const int64_t want = truth[q * kK + j];
            if (want < 0) continue;
            hits += std::count(ids.begin() + q * kK,
                               ids.begin() + (q + 1) * kK, want);
          }
        }
        c.recall = static_cast<double>(hits) / static_cast<double>(nq * kK);
      }
    }
  }
  std::printf("%s: %lld rows, filter %s < %lld admits %lld (%.2f%%), "
              "lists %s, nprobe %d, refine_factor %d, %lld queries (%lld a "
              "call) x %d rounds\n",
              info.path.c_str(), static_cast<long long>(info.ntotal),
              absl::GetFlag(FLAGS_field).c_str(),
              static_cast<long long>(absl::GetFlag(FLAGS_below)),
              static_cast<long long>(matched),
              100.0 * static_cast<double>(matched) /
                  static_cast<double>(info.ntotal),
              lists != nullptr ? "kept" : "not kept", nprobe, refine,
              static_cast<long long>(nq), static_cast<long long>(batch),
              absl::GetFlag(FLAGS_rounds));
  const double unfiltered_us = [&] {
    std::vector<double> v = cases[0].us;
    if (v.empty()) return 0.0;  // --only another case
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }();
  for (Case& c : cases) {
    if (c.us.empty()) continue;
    std::sort(c.us.begin(), c.us.end());
    const double median = c.us[c.us.size() / 2];
    std::printf("  %-13s %7.1f us/query (%.1f-%.1f)", c.name, median,
                c.us.front(), c.us.back());
    if (unfiltered_us > 0) {
      std::printf(", x unfiltered time %.2f", median / unfiltered_us);
    }
    if (c.filtered) {
      std::printf(", %s plan, recall@10 among matches %.3f",
                  knnd::FilterPlanName(c.plan), c.recall);
    }
    std::printf("\n");
  }
  return 0;
}
