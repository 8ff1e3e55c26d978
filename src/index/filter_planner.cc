#include "knnd/index/filter_planner.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "knnd/index/rerank.h"

namespace knnd {
namespace {

// Costs in the coarse search's multiply-adds (the unit), as measured in
// knnd on 1M x 128 (M 64) and Fashion-MNIST (M 196) at 1% and 10%
// (bench/RESULTS.md "Kept filters with their own codes"): a FastScan
// code ~0.034 ns per sub-quantizer against ~0.11 ns a coarse
// multiply-add, about M / 4 (M / 16, its SIMD lookups alone, put the flat
// plan's 10,062 codes at a third of their time); an 8-bit code one
// table lookup and add per sub-quantizer.
double CodeCost(const IndexFacts& facts) {
  return facts.fastscan ? facts.pq_m / 4.0 : facts.pq_m;
}

// A matching row's multiply-add in the exact plan costs about twice a
// coarse one: its rows are read at random from the mapped vectors file
// (Fashion-MNIST 1%: 576 rows x 784 dims in 99 us, 0.22 ns each).
constexpr double kExactRowCost = 2.0;

}  // namespace

const char* FilterPlanName(FilterPlan plan) {
  switch (plan) {
    case FilterPlan::kExact:
      return "exact";
    case FilterPlan::kIvf:
      return "ivf";
    case FilterPlan::kFlat:
      return "flat";
  }
  return "?";
}

int StartingNprobe(const IndexFacts& facts, const FilterPlanInput& input) {
  const int64_t nlist = std::max<int64_t>(facts.nlist, 1);
  const int64_t matched = std::max<int64_t>(input.matched_rows, 1);
  // Lists holding `candidates` matches when matches spread evenly.
  const int64_t lists = (input.candidates * nlist + matched - 1) / matched;
  // A query's closest matches lie farther out than its closest rows (the
  // k-th match is about the (k / selectivity)-th row), in lists the
  // request's nprobe would not reach: nprobe / sqrt(selectivity) keeps the
  // recall of the unfiltered search (Fashion-MNIST at 10%: 0.885 at
  // nprobe 4, bench/RESULTS.md "Filters").
  const double selectivity =
      std::min(1.0, static_cast<double>(matched) /
                        static_cast<double>(std::max<int64_t>(facts.ntotal, 1)));
  const int64_t widened =
      static_cast<int64_t>(std::ceil(input.nprobe / std::sqrt(selectivity)));
  return static_cast<int>(
      std::min(nlist, std::max({int64_t{input.nprobe}, lists, widened})));
}

FilterPlan ChooseFilterPlan(const IndexFacts& facts,
                            const FilterPlanInput& input) {
  const double dim = facts.dim;
  const double matched = static_cast<double>(input.matched_rows);
  const double nlist = std::max<double>(static_cast<double>(facts.nlist), 1);
  const double probes = StartingNprobe(facts, input);
  const double scanned =
      probes *
      (input.filtered_lists ? matched : static_cast<double>(facts.ntotal)) /
      nlist;
  // Look-up tables of 2^nbits entries per sub-quantizer: the query's
  // (distances to every sub-centroid, then quantized), and where codes are
  // residuals of an L2 index one more per probed list (the precomputed
  // table's, added and quantized).
  const double ksub = 1 << std::min(std::max(facts.pq_nbits, 1), 8);
  const double table = ksub * (facts.ivf_dim + facts.pq_m);
  const bool per_list = facts.by_residual && facts.metric == Metric::kL2;
  const double rerank = input.has_vectors ? input.candidates * dim : 0;
  const double ivf = nlist * facts.ivf_dim + table +
                     (per_list ? probes * 2 * ksub * facts.pq_m : 0) +
                     scanned * CodeCost(facts) + rerank;
  FilterPlan plan = FilterPlan::kIvf;
  double cost = ivf;
  if (input.filtered_lists && facts.fastscan && !facts.by_residual) {
    const double flat = table + matched * CodeCost(facts) + rerank;
    if (flat < cost) {
      plan = FilterPlan::kFlat;
      cost = flat;
    }
  }
  if (input.has_vectors && kExactRowCost * matched * dim <= cost) {
    plan = FilterPlan::kExact;
  }
  return plan;
}

absl::Status SearchIvfWidening(const ServingIndex& index, const SearchArgs& call,
                               int start_nprobe, int64_t need) {
  const int64_t nlist = index.facts().nlist;
  const int dim = index.facts().dim;
  const int64_t probe_budget =
      std::max<int64_t>(call.num_queries * call.nprobe, 1);
  std::vector<int64_t> pending(static_cast<size_t>(call.num_queries));
  for (int64_t q = 0; q < call.num_queries; ++q) pending[q] = q;
  std::vector<float> queries;
  std::vector<float> distances;
  std::vector<int64_t> ids;
  for (int64_t nprobe = start_nprobe;; nprobe = std::min(nlist, 2 * nprobe)) {
    const int64_t group =
        std::max<int64_t>(1, std::min<int64_t>(probe_budget / nprobe,
                                               call.num_queries));
    SearchArgs part = call;
    part.nprobe = static_cast<int>(nprobe);
    if (static_cast<int64_t>(pending.size()) == call.num_queries &&
        group >= call.num_queries) {
      if (absl::Status s = index.Search(part); !s.ok()) return s;
    } else {
      for (size_t begin = 0; begin < pending.size();
           begin += static_cast<size_t>(group)) {
        const size_t end =
            std::min(pending.size(), begin + static_cast<size_t>(group));
        const size_t rows = end - begin;
        queries.resize(rows * dim);
        distances.resize(rows * call.k);
        ids.resize(rows * call.k);
        for (size_t i = 0; i < rows; ++i) {
          std::copy_n(call.queries + pending[begin + i] * dim, dim,
                      queries.data() + i * dim);
        }
        part.queries = queries.data();
        part.num_queries = static_cast<int64_t>(rows);
        part.distances = distances.data();
        part.ids = ids.data();
        if (absl::Status s = index.Search(part); !s.ok()) return s;
        for (size_t i = 0; i < rows; ++i) {
          const int64_t q = pending[begin + i];
          std::copy_n(distances.data() + i * call.k, call.k,
                      call.distances + q * call.k);
          std::copy_n(ids.data() + i * call.k, call.k, call.ids + q * call.k);
        }
      }
    }
    if (nprobe >= nlist) return absl::OkStatus();
    // The queries that found fewer than they need go round again.
    std::vector<int64_t> short_of;
    for (int64_t q : pending) {
      const int64_t* row = call.ids + q * call.k;
      const int64_t found = std::count_if(row, row + call.k,
                                          [](int64_t id) { return id >= 0; });
      if (found < need) short_of.push_back(q);
    }
    if (short_of.empty()) return absl::OkStatus();
    pending = std::move(short_of);
  }
}

void SearchExactRows(const VectorsFile& vectors, const ListIds& list_ids,
                     Metric metric, const float* queries, int64_t num_queries,
                     absl::Span<const int64_t> list_ids_held, int k,
                     float* distances, int64_t* ids) {
  const int held = static_cast<int>(list_ids_held.size());
  const int64_t dim = vectors.dim();
  for (int64_t q = 0; q < num_queries; ++q) {
    RerankExact(vectors, list_ids, metric, queries + q * dim, 1, held,
                list_ids_held.data(), k, distances + q * k, ids + q * k);
  }
}

}  // namespace knnd
