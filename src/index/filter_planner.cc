#include "knnd/index/filter_planner.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

int ReferenceRank(int k, int64_t matched_rows, int64_t ntotal) {
  const double selectivity =
      static_cast<double>(std::max<int64_t>(matched_rows, 1)) /
      static_cast<double>(std::max<int64_t>(ntotal, 1));
  const double rank = std::ceil(k / std::min(1.0, selectivity));
  return static_cast<int>(
      std::max<double>(k, std::min<double>(kMaxReferenceRank, rank)));
}

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
  const double list_rows = static_cast<double>(facts.ntotal) / nlist;
  // Look-up tables of 2^nbits entries per sub-quantizer: the query's
  // (distances to every sub-centroid, then quantized), and where codes are
  // residuals of an L2 index one more per probed list (the precomputed
  // table's, added and quantized).
  const double ksub = 1 << std::min(std::max(facts.pq_nbits, 1), 8);
  const double table = ksub * (facts.ivf_dim + facts.pq_m);
  const bool per_list = facts.by_residual && facts.metric == Metric::kL2;
  // An IVF scan of `probes` lists reading `codes` codes of each.
  const auto scan = [&](double probes, double codes) {
    return nlist * facts.ivf_dim + table +
           (per_list ? probes * 2 * ksub * facts.pq_m : 0) +
           probes * codes * CodeCost(facts);
  };
  const double rerank = input.has_vectors ? input.candidates * dim : 0;
  const double ivf = scan(StartingNprobe(facts, input),
                          input.filtered_lists ? matched / nlist : list_rows) +
                     rerank;
  FilterPlan plan = FilterPlan::kIvf;
  double cost = ivf;
  if (input.filtered_lists && facts.fastscan && !facts.by_residual) {
    const double flat = table + matched * CodeCost(facts) + rerank;
    if (flat < cost) {
      plan = FilterPlan::kFlat;
      cost = flat;
    }
  }
  // Few matches are searched exactly. A search that re-ranks takes the
  // cheapest plan: the flat plan's re-ranked answer is nearly the exact one.
  // One that does not would get estimates from the others (the flat plan's
  // over 143 matching rows agreed with the exact answer on 0.91 of its
  // ids): it is searched exactly where that costs no more than the IVF
  // plan, or than the unfiltered search at its nprobe would.
  const double exact_bar =
      input.reranked ? cost
                     : std::max(ivf, scan(std::min<double>(input.nprobe, nlist),
                                          list_rows));
  if (input.has_vectors && kExactRowCost * matched * dim <= exact_bar) {
    plan = FilterPlan::kExact;
  }
  return plan;
}

}  // namespace knnd
