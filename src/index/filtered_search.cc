#include "knnd/index/filtered_search.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "knnd/index/rerank.h"

namespace knnd {

namespace {

// A distance of the index's own as a squared L2 distance: itself, or for an
// inner-product index (normalised vectors, cosine) 2 - 2 * similarity, the
// squared distance of unit vectors, so that the widening reads the same
// for both metrics.
float AsSquaredL2(Metric metric, float d) {
  return SmallerIsCloser(metric) ? d : 2 - 2 * d;
}

// A query's k-th match counts as far out when it lies beyond this many
// times the squared distance at which the k-th match of a filter spread
// evenly over the rows lies (ProbeReference::nearest_rank, one list's
// estimate of it).
constexpr float kFarOut = 1.5f;

// One query's standing after a pass of the IVF plan.
struct Standing {
  const int64_t* ids;  // call.k results, closest first
  const float* distances;
  int64_t found;  // results that are matches
};

// Whether the query's k-th match lies farther out than the lists probed
// reach: beyond the k-th row of its closest list (what an unfiltered
// answer reaches) by more than its farthest probed list (ref.frontier)
// lies beyond the request's nprobe-th (ref.anchor). A filter spread
// evenly over the space puts its k-th match about where its selectivity
// says, which the starting nprobe already covers; one that follows the
// space (a topic held by a few clusters, everything but the query's own
// region) puts it well beyond, in lists far from the query's own
// neighbourhood: the first lists to hold k matches are not those holding
// the nearest.
bool ReachesFarther(Metric metric, const Standing& q, int k,
                    const ProbeReference& ref) {
  if (q.found < k) return false;  // fewer than k match: all are found
  const float kth = AsSquaredL2(metric, q.distances[k - 1]);
  const float nearest = AsSquaredL2(metric, ref.nearest_kth);
  const float shift =
      std::isfinite(nearest) ? std::max(0.0f, kth - nearest) : 0.0f;
  return AsSquaredL2(metric, ref.frontier) <
         AsSquaredL2(metric, ref.anchor) + shift;
}

// Whether the query's k-th match lies far out (kFarOut) against where an
// evenly spread filter's would: then the widening goes on while it brings
// new results (NewResults), since where the data has few dimensions a far
// list's edge comes closer to the query than its centroid says, and the
// shift of ReachesFarther falls short.
bool FarOut(Metric metric, const Standing& q, int k,
            const ProbeReference& ref) {
  if (q.found < k) return false;
  const float expected = AsSquaredL2(metric, ref.nearest_rank);
  return std::isfinite(expected) &&
         AsSquaredL2(metric, q.distances[k - 1]) > kFarOut * expected;
}

// How many of the query's first `need` results are not among `before`
// (sorted ascending): what the last widening brought.
int64_t NewResults(const Standing& q, int64_t need,
                   absl::Span<const int64_t> before) {
  int64_t fresh = 0;
  for (int64_t j = 0; j < need; ++j) {
    if (q.ids[j] >= 0 &&
        !std::binary_search(before.begin(), before.end(), q.ids[j])) {
      ++fresh;
    }
  }
  return fresh;
}

// Merges one query's results `a` (k, closest first: the previous passes')
// with `b` (k: this pass's, of other lists) into `a`: the k closest of
// both, a's first among equal distances. Missing results (id -1, at
// MissingDistance) come last on their own.
void MergeResults(Metric metric, int k, float* a_distances, int64_t* a_ids,
                  const float* b_distances, const int64_t* b_ids,
                  std::vector<float>& distances, std::vector<int64_t>& ids) {
  const bool smaller = SmallerIsCloser(metric);
  distances.resize(static_cast<size_t>(k));
  ids.resize(static_cast<size_t>(k));
  int i = 0, j = 0;
  for (int out = 0; out < k; ++out) {
    const bool take_b = smaller ? b_distances[j] < a_distances[i]
                                : b_distances[j] > a_distances[i];
    if (take_b) {
      distances[out] = b_distances[j];
      ids[out] = b_ids[j++];
    } else {
      distances[out] = a_distances[i];
      ids[out] = a_ids[i++];
    }
  }
  std::copy(distances.begin(), distances.end(), a_distances);
  std::copy(ids.begin(), ids.end(), a_ids);
}

}  // namespace

absl::Status SearchIvfWidening(const ServingIndex& index,
                               const SearchArgs& call, const IvfWidening& plan,
                               std::vector<char>* far_out) {
  const int64_t nlist = index.facts().nlist;
  const int dim = index.facts().dim;
  const Metric metric = index.facts().metric;
  const int k = std::max(1, std::min(plan.k, call.k));
  const int64_t need = std::min<int64_t>(plan.need, call.k);
  const int rank = ReferenceRank(k, plan.matched_rows, index.facts().ntotal);
  const int64_t probe_budget =
      std::max<int64_t>(call.num_queries * call.nprobe, 1);
  std::vector<int64_t> pending(static_cast<size_t>(call.num_queries));
  for (int64_t q = 0; q < call.num_queries; ++q) pending[q] = q;
  if (far_out != nullptr) far_out->assign(pending.size(), 0);
  // Each query's reference (its closest list's rows from the first pass,
  // which searches every query; its frontier from its last), and the ids
  // of its first `need` results after its previous pass, sorted.
  std::vector<ProbeReference> refs(static_cast<size_t>(call.num_queries));
  std::vector<int64_t> before(static_cast<size_t>(call.num_queries * need));
  std::vector<ProbeReference> group_refs;
  std::vector<float> queries;
  std::vector<float> distances;
  std::vector<int64_t> ids;
  std::vector<float> merged_distances;
  std::vector<int64_t> merged_ids;
  // Each pass scans only the lists past the previous pass's nprobe, and
  // merges what it finds with what that pass found.
  int64_t scanned = 0;
  for (int64_t nprobe = plan.start_nprobe;;
       nprobe = std::min(nlist, 2 * nprobe)) {
    const bool first = scanned == 0;
    const int64_t group = std::max<int64_t>(
        1, std::min<int64_t>(probe_budget / nprobe, call.num_queries));
    SearchArgs part = call;
    part.nprobe = static_cast<int>(nprobe);
    part.skip_probes = static_cast<int>(scanned);
    part.reference_nprobe = call.nprobe;
    part.reference_k = first ? k : 0;
    part.reference_rank = first ? rank : 0;
    if (first && group >= call.num_queries) {
      part.probe_reference = refs.data();
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
        group_refs.resize(rows);
        for (size_t i = 0; i < rows; ++i) {
          std::copy_n(call.queries + pending[begin + i] * dim, dim,
                      queries.data() + i * dim);
          group_refs[i] = refs[pending[begin + i]];
        }
        part.queries = queries.data();
        part.num_queries = static_cast<int64_t>(rows);
        part.distances = distances.data();
        part.ids = ids.data();
        part.probe_reference = group_refs.data();
        if (absl::Status s = index.Search(part); !s.ok()) return s;
        for (size_t i = 0; i < rows; ++i) {
          const int64_t q = pending[begin + i];
          float* const q_distances = call.distances + q * call.k;
          int64_t* const q_ids = call.ids + q * call.k;
          if (first) {
            std::copy_n(distances.data() + i * call.k, call.k, q_distances);
            std::copy_n(ids.data() + i * call.k, call.k, q_ids);
          } else {
            MergeResults(metric, call.k, q_distances, q_ids,
                         distances.data() + i * call.k, ids.data() + i * call.k,
                         merged_distances, merged_ids);
          }
          refs[q] = group_refs[i];
        }
      }
    }
    scanned = nprobe;
    if (nprobe >= nlist) return absl::OkStatus();
    // The queries that found fewer than they need, whose matches lie
    // farther out than the lists probed reach, or lie far out and the
    // last widening still brought new ones, go round again.
    std::vector<int64_t> short_of;
    for (int64_t q : pending) {
      Standing standing{call.ids + q * call.k, call.distances + q * call.k, 0};
      standing.found = std::count_if(standing.ids, standing.ids + call.k,
                                     [](int64_t id) { return id >= 0; });
      const absl::Span<int64_t> was(before.data() + q * need,
                                    static_cast<size_t>(need));
      const bool farther = ReachesFarther(metric, standing, k, refs[q]);
      const bool far = FarOut(metric, standing, k, refs[q]);
      if (far_out != nullptr && (farther || far)) (*far_out)[q] = 1;
      const bool again =
          standing.found < need || farther ||
          (far && (first || NewResults(standing, need, was) >
                                std::max<int64_t>(1, need / 20)));
      if (!again) continue;
      short_of.push_back(q);
      std::copy_n(standing.ids, need, was.begin());
      std::sort(was.begin(), was.end());
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
