#include "knnd/faiss/fastscan_search.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/impl/FaissAssert.h>
#include <faiss/impl/LookupTableScaler.h>
#include <faiss/impl/pq4_fast_scan.h>
#include <faiss/impl/simd_result_handlers.h>
#include <faiss/utils/AlignedTable.h>
#include <faiss/utils/Heap.h>
#include <faiss/utils/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "knnd/faiss/coarse_l2.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/fastscan_kernel.h"
#include "knnd/faiss/fastscan_lut.h"
#include "knnd/faiss/fastscan_qbs.h"
#include "knnd/faiss/fastscan_reference.h"
#include "knnd/faiss/filtered_lists.h"

namespace knnd {
namespace {

using idx_t = faiss::Index::idx_t;

constexpr int64_t kMaxK = int64_t{1} << 20;
constexpr int64_t kMaxQueryProbes = int64_t{1} << 31;  // FAISS indexes them by int

using fastscan_lut::ComputeQuantizedLuts;
using fastscan_lut::QuantizedLuts;

// One (query, probed list) pair; sorted by list so that a list's codes are
// read once for all the queries that probe it.
struct Probe {
  int qno;
  int list_no;
  int rank;  // position in the query's coarse result
};

// The probes of ranks [skip, nprobe) of each of the n queries.
std::vector<Probe> SortedProbes(size_t n, size_t nprobe,
                                const idx_t* coarse_ids, size_t skip) {
  std::vector<Probe> probes;
  probes.reserve(n * (nprobe - skip));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = skip; j < nprobe; ++j) {
      const idx_t list = coarse_ids[i * nprobe + j];
      if (list >= 0) {
        probes.push_back(
            Probe{static_cast<int>(i), static_cast<int>(list),
                  static_cast<int>(j)});
      }
    }
  }
  std::sort(probes.begin(), probes.end(),
            [](const Probe& a, const Probe& b) { return a.list_no < b.list_no; });
  return probes;
}

// FAISS's reservoir (implementation 13, for k > 20) is 1.2x to 1.4x faster
// than its heap at k 40 to 160 (frontier_bench, refine 4 to 16), but where
// FAISS keeps its asserts it aborts when more than (capacity + k) / 2 of its
// candidates tie at quantized distance 0 (many copies of the query in the
// probed lists): partitioning.cpp's compress_array asserts what its own
// fallback just made false. Its results there are right (the first k of the
// ties), so only builds with those asserts (Debian's libfaiss) use the heap.
#if defined(KNND_FAISS_KEEPS_ASSERTS)
constexpr bool kReservoirAborts = true;
#else
constexpr bool kReservoirAborts = false;
#endif

// What FAISS's ReservoirHandler::to_flat_arrays writes (each query's k
// kept results best first, distances rescaled as d = v / a + b by the
// normalizers, then the heap's neutral entries for the places left), with
// the estimates ordered by a stable two-pass radix sort of their 16 bits
// instead of its indirect std::sort: equal estimates come in the order the
// reservoir holds them (the scan's, for any batch), not std::sort's. That
// sort was 4% of a 384-dim batch query re-ranking 60 candidates
// (bench/RESULTS.md "Reservoirs sorted by radix").
template <class C>
void ReservoirsToArrays(
    std::vector<faiss::simd_result_handlers::ReservoirTopN<C>>& reservoirs,
    const float* normalizers, float* distances, idx_t* labels) {
  using Cf = typename std::conditional<C::is_max, faiss::CMax<float, idx_t>,
                                       faiss::CMin<float, idx_t>>::type;
  static_assert(std::is_same<typename C::T, uint16_t>::value,
                "FastScan estimates are 16-bit");
  std::vector<uint32_t> order, spare;
  for (size_t q = 0; q < reservoirs.size(); ++q) {
    faiss::simd_result_handlers::ReservoirTopN<C>& res = reservoirs[q];
    const size_t k = res.n;
    if (res.i > res.n) res.shrink();
    const size_t m = res.i;
    // Best first: ascending estimates where the smallest are kept (L2),
    // descending where the largest are (inner product).
    auto key = [&res](uint32_t j) -> uint32_t {
      return C::is_max ? res.vals[j] : 0xFFFFu - res.vals[j];
    };
    order.resize(m);
    spare.resize(m);
    for (size_t j = 0; j < m; ++j) order[j] = static_cast<uint32_t>(j);
    for (int shift = 0; shift < 16; shift += 8) {
      size_t start[257] = {};
      for (size_t j = 0; j < m; ++j) {
        ++start[((key(order[j]) >> shift) & 0xFF) + 1];
      }
      for (int b = 1; b < 257; ++b) start[b] += start[b - 1];
      for (size_t j = 0; j < m; ++j) {
        spare[start[(key(order[j]) >> shift) & 0xFF]++] = order[j];
      }
      order.swap(spare);
    }
    float one_a = 1, b = 0;
    if (normalizers != nullptr) {
      one_a = 1 / normalizers[2 * q];
      b = normalizers[2 * q + 1];
    }
    float* dis = distances + q * k;
    idx_t* ids = labels + q * k;
    for (size_t j = 0; j < m; ++j) {
      dis[j] = res.vals[order[j]] * one_a + b;
      ids[j] = res.ids[order[j]];
    }
    faiss::heap_heapify<Cf>(k - m, dis + m, ids + m);
  }
}

// Unfiltered scan: the qbs kernel (knnd's AVX-512 one where the CPU runs
// it, FAISS's otherwise: fastscan_qbs.h) with one of FAISS's result
// handlers (the ones its library instantiates the kernel for), groups of at
// most qbs2 queries per list as IndexIVFFastScan::search_implem_12 does.
template <class Handler>
void ScanGroups(const faiss::IndexIVFPQFastScan& ivf, size_t nprobe,
                const QuantizedLuts& luts, const std::vector<Probe>& probes,
                Handler& handler) {
  const faiss::InvertedLists& lists = *ivf.invlists;
  const size_t dim12_2 = ivf.ksub * ivf.M2;
  const size_t qbs2 = ivf.qbs2 != 0 ? ivf.qbs2 : 11;
  std::vector<uint16_t> group_bias(qbs2);
  std::vector<int> q_map(qbs2), lut_entries(qbs2);
  const bool avx512 = fastscan_qbs::UsesAvx512();
  // FAISS's kernel reads the group's tables packed (pq4_pack_LUT_qbs_q_map).
  faiss::AlignedTable<uint8_t> group_lut(avx512 ? 0 : qbs2 * dim12_2);
  if (luts.has_bias) handler.dbias = group_bias.data();
  faiss::DummyScaler scaler;

  size_t i0 = 0;
  while (i0 < probes.size()) {
    const int list_no = probes[i0].list_no;
    size_t i1 = i0 + 1;
    while (i1 < probes.size() && i1 < i0 + qbs2 &&
           probes[i1].list_no == list_no) {
      ++i1;
    }
    const size_t list_size = lists.list_size(list_no);
    if (list_size == 0) {
      i0 = i1;
      continue;
    }
    const int nc = static_cast<int>(i1 - i0);
    for (size_t i = i0; i < i1; ++i) {
      const Probe& p = probes[i];
      const size_t ij = static_cast<size_t>(p.qno) * nprobe + p.rank;
      q_map[i - i0] = p.qno;
      lut_entries[i - i0] = luts.is_3d ? static_cast<int>(ij) : p.qno;
      if (luts.has_bias) group_bias[i - i0] = luts.biases[ij];
    }
    const int qbs = faiss::pq4_preferred_qbs(nc);
    faiss::InvertedLists::ScopedCodes codes(&lists, list_no);
    faiss::InvertedLists::ScopedIds ids(&lists, list_no);
    handler.ntotal = list_size;
    handler.q_map = q_map.data();
    handler.id_map = ids.get();
    const int m2 = static_cast<int>(ivf.M2);
    if (avx512) {
      fastscan_qbs::AccumulateAvx512(qbs, list_size, m2, codes.get(),
                                     luts.tables.get(), lut_entries.data(),
                                     handler);
    } else {
      faiss::pq4_pack_LUT_qbs_q_map(qbs, m2, luts.tables.get(),
                                    lut_entries.data(), group_lut.get());
      faiss::pq4_accumulate_loop_qbs(qbs, list_size, m2, codes.get(),
                                     group_lut.get(), handler, scaler);
    }
    i0 = i1;
  }
}

template <class C>
void ScanUnfiltered(const faiss::IndexIVFPQFastScan& ivf, size_t n, size_t k,
                    size_t nprobe, const QuantizedLuts& luts,
                    const std::vector<Probe>& probes, float* distances,
                    idx_t* labels) {
  namespace rh = faiss::simd_result_handlers;
  const float* norm = luts.normalizers.data();
  if (k == 1) {
    rh::SingleResultHandler<C, true> handler(n, 0);
    ScanGroups(ivf, nprobe, luts, probes, handler);
    handler.to_flat_arrays(distances, labels, norm);
  } else if (k <= 20 || kReservoirAborts) {  // FAISS: implementation 12 (heap)
    faiss::AlignedTable<uint16_t> heap_dis(n * k);
    rh::HeapHandler<C, true> handler(static_cast<int>(n), heap_dis.get(),
                                     labels, k, 0);
    ScanGroups(ivf, nprobe, luts, probes, handler);
    handler.to_flat_arrays(distances, labels, norm);
  } else {  // implementation 13 (reservoir)
    rh::ReservoirHandler<C, true> handler(n, 0, k, 2 * k);
    ScanGroups(ivf, nprobe, luts, probes, handler);
    ReservoirsToArrays(handler.reservoirs, norm, distances, labels);
  }
}

// Where a filtered scan keeps each query's best k, as ScanUnfiltered keeps
// them for the same k: FAISS's heaps, or for k > 20 its reservoirs (60
// candidates of a 1M-row 50% filter: 47 -> 40 us a query against the
// heaps). Both offer a candidate beating the bound, in the scan's order,
// so a filter admitting every row gives the unfiltered answer. Finish()
// writes the n queries' k distances (d = v / a + b, the normalizers) and
// labels, best first.
template <bool kKeepMin>
class HeapKeep {
 public:
  using C = fastscan_kernel::HeapOf<kKeepMin>;
  HeapKeep(size_t n, size_t k, idx_t* labels)
      : n_(n), k_(k), dis_(n * k), labels_(labels) {
    for (size_t q = 0; q < n; ++q) {
      faiss::heap_heapify<C>(k, dis_.data() + q * k, labels + q * k);
    }
  }
  void List(size_t q, const uint8_t* codes, size_t n, const int64_t* ids,
            size_t m2, const uint8_t* lut, uint16_t bias,
            const IdFilter& filter) {
    fastscan_kernel::ScanListFiltered<kKeepMin>(codes, n, ids, m2, lut, bias,
                                                filter, k_, Dis(q), Labels(q));
  }
  void Rows(size_t q, const uint8_t* codes, size_t begin, size_t end,
            const int64_t* ids, size_t m2, const uint8_t* lut,
            uint16_t bias) {
    fastscan_kernel::ScanRowsAdmitted<kKeepMin>(codes, begin, end, ids, m2,
                                                lut, bias, k_, Dis(q),
                                                Labels(q));
  }
  void Finish(const float* normalizers, float* distances) {
    for (size_t q = 0; q < n_; ++q) {
      faiss::heap_reorder<C>(k_, Dis(q), Labels(q));
      const float one_a = 1 / normalizers[2 * q];
      for (size_t j = 0; j < k_; ++j) {
        distances[q * k_ + j] = Dis(q)[j] * one_a + normalizers[2 * q + 1];
      }
    }
  }

 private:
  uint16_t* Dis(size_t q) { return dis_.data() + q * k_; }
  idx_t* Labels(size_t q) { return labels_ + q * k_; }
  const size_t n_;
  const size_t k_;
  std::vector<uint16_t> dis_;
  idx_t* const labels_;
};

template <bool kKeepMin>
class ReservoirKeep {
 public:
  ReservoirKeep(size_t n, size_t k, idx_t* labels)
      : handler_(n, 0, k, 2 * k), labels_(labels) {}
  void List(size_t q, const uint8_t* codes, size_t n, const int64_t* ids,
            size_t m2, const uint8_t* lut, uint16_t bias,
            const IdFilter& filter) {
    fastscan_kernel::ScanListFiltered<kKeepMin>(codes, n, ids, m2, lut, bias,
                                                filter, handler_.reservoirs[q]);
  }
  void Rows(size_t q, const uint8_t* codes, size_t begin, size_t end,
            const int64_t* ids, size_t m2, const uint8_t* lut,
            uint16_t bias) {
    fastscan_kernel::ScanRowsAdmitted<kKeepMin>(codes, begin, end, ids, m2,
                                                lut, bias,
                                                handler_.reservoirs[q]);
  }
  void Finish(const float* normalizers, float* distances) {
    ReservoirsToArrays(handler_.reservoirs, normalizers, distances, labels_);
  }

 private:
  faiss::simd_result_handlers::ReservoirHandler<
      fastscan_kernel::HeapOf<kKeepMin>, true>
      handler_;
  idx_t* const labels_;
};

// Runs scan(keep) with the keeper ScanUnfiltered's choice of k gives (where
// FAISS keeps asserts, always the heaps), then its Finish().
template <bool kKeepMin, class Scan>
void WithKeep(size_t n, size_t k, const float* normalizers, float* distances,
              idx_t* labels, const Scan& scan) {
  if (k > 20 && !kReservoirAborts) {
    ReservoirKeep<kKeepMin> keep(n, k, labels);
    scan(keep);
    keep.Finish(normalizers, distances);
  } else {
    HeapKeep<kKeepMin> keep(n, k, labels);
    scan(keep);
    keep.Finish(normalizers, distances);
  }
}

// Filtered scan: knnd's kernel, one query at a time per list (lists still in
// order, so a list is read while it is hot for all its queries); with the
// filter's lists (`admitted` not null) only their codes, none tested.
template <bool kKeepMin>
void ScanFiltered(const faiss::IndexIVFPQFastScan& ivf, size_t n, size_t k,
                  size_t nprobe, const QuantizedLuts& luts,
                  const std::vector<Probe>& probes, const IdFilter& filter,
                  const FilteredLists* admitted, float* distances,
                  idx_t* labels) {
  const faiss::InvertedLists& lists = *ivf.invlists;
  const size_t dim12_2 = ivf.ksub * ivf.M2;
  WithKeep<kKeepMin>(n, k, luts.normalizers.data(), distances, labels,
                     [&](auto& keep) {
    for (const Probe& p : probes) {
      const size_t list_size = admitted != nullptr
                                   ? admitted->size(p.list_no)
                                   : lists.list_size(p.list_no);
      if (list_size == 0) continue;
      const size_t ij = static_cast<size_t>(p.qno) * nprobe + p.rank;
      const uint8_t* lut =
          luts.tables.get() + (luts.is_3d ? ij : p.qno) * dim12_2;
      const uint16_t bias = luts.has_bias ? luts.biases[ij] : 0;
      if (admitted != nullptr) {
        const size_t begin = static_cast<size_t>(admitted->begin(p.list_no));
        keep.Rows(p.qno, admitted->codes(), begin, begin + list_size,
                  admitted->ids(), ivf.M2, lut, bias);
        continue;
      }
      faiss::InvertedLists::ScopedCodes codes(&lists, p.list_no);
      faiss::InvertedLists::ScopedIds ids(&lists, p.list_no);
      keep.List(p.qno, codes.get(), list_size, ids.get(), ivf.M2, lut, bias,
                filter);
    }
  });
}

// The flat plan: every row of `admitted` for each query, through its one
// table (codes that are not residuals), the best k kept as ScanFiltered
// keeps them.
template <bool kKeepMin>
void ScanAdmittedRows(const faiss::IndexIVFPQFastScan& ivf, size_t n, size_t k,
                      const QuantizedLuts& luts, const FilteredLists& admitted,
                      float* distances, idx_t* labels) {
  const size_t dim12_2 = ivf.ksub * ivf.M2;
  WithKeep<kKeepMin>(n, k, luts.normalizers.data(), distances, labels,
                     [&](auto& keep) {
    for (size_t q = 0; q < n; ++q) {
      keep.Rows(q, admitted.codes(), 0, static_cast<size_t>(admitted.rows()),
                admitted.ids(), ivf.M2, luts.tables.get() + q * dim12_2, 0);
    }
  });
}

// Look-up-table bytes of one slice of a batch: a batch is searched in slices
// whose tables stay in the core's cache (L2) from their computation to the
// scan; one slice of the whole batch (FAISS's choice under its 2 GiB
// precomputed_table_max_bytes) spent a fifth of a 2,000-query Fashion-MNIST
// call faulting in and streaming 300 MB of float tables. A query's results do
// not depend on the slicing.
// 960 KiB: under glibc's mmap threshold as knnd fixes it (1 MiB,
// malloc_mmap_threshold_bytes), so that a slice's tables come from the heap
// instead of being mapped and faulted in on every call (with 2 MiB slices
// and FAISS's rounding, 256-row Fashion-MNIST requests took ~1,000 page
// faults each, 20% of knnd's time: bench/RESULTS.md "Peers").
constexpr size_t kSliceLutBytes = size_t{960} << 10;

size_t NumSlices(const faiss::IndexIVFPQFastScan& ivf, size_t n,
                 size_t nprobe) {
  const size_t tables = ivf.by_residual && ivf.metric_type == faiss::METRIC_L2
                            ? nprobe
                            : 1;
  const size_t lut_bytes_per_query = ivf.M2 * ivf.ksub * tables;
  const size_t nq_ok = std::max<size_t>(kSliceLutBytes / lut_bytes_per_query, 1);
  return std::max<size_t>((n + nq_ok - 1) / nq_ok, 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FastScanSearcher>> FastScanSearcher::Create(
    const faiss::Index* index, std::string name) {
  const std::string options = faiss::get_compile_options();
#if defined(__AVX2__)
  const bool we_avx2 = true;
#else
  const bool we_avx2 = false;
#endif
  if (absl::StrContains(options, "AVX2") != we_avx2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot search ", name, ": the FAISS library was built with \"",
        options, "\" but fastscan_search.cc was compiled ",
        we_avx2 ? "with" : "without",
        " AVX2; compile it with the library's SIMD flags (-mavx2 -mfma for an "
        "AVX2 FAISS, none for Debian's generic build)"));
  }
  FastScanParts parts;
  if (std::string why = CheckFastScanIndex(*index, parts); !why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot search ", name, " as FastScan: ", why));
  }
  if (parts.ivf->invlists == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot search ", name, ": the index has no lists"));
  }
  const faiss::ProductQuantizer& pq = parts.ivf->pq;
  std::vector<float> by_dim;
  if (fastscan_lut::D4TablesApply(pq.dsub, pq.ksub)) {
    by_dim = fastscan_lut::CentroidsByDim(pq.centroids.data(), pq.M);
  }
  std::vector<float> norms = coarse_l2::CentroidNorms(*parts.ivf->quantizer);
  return std::unique_ptr<FastScanSearcher>(new FastScanSearcher(
      std::move(parts), std::move(by_dim), std::move(norms), std::move(name)));
}

absl::Status FastScanSearcher::Search(const SearchArgs& args) const {
  const int64_t n = args.num_queries;
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("search of ", name_, ": n=", n, " is negative"));
  }
  if (args.k < 1 || args.k > kMaxK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", name_, ": k=", args.k, " outside [1, ", kMaxK, "]"));
  }
  if (args.nprobe < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", name_, ": nprobe=", args.nprobe, " is below 1"));
  }
  const int64_t nprobe =
      std::min<int64_t>(args.nprobe, static_cast<int64_t>(parts_.ivf->nlist));
  if (n > 0 && (args.queries == nullptr || args.distances == nullptr ||
                args.ids == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("search of ", name_, ": null query or output array"));
  }
  if (n > kMaxQueryProbes / nprobe) {
    return absl::InvalidArgumentError(
        absl::StrCat("search of ", name_, ": n * nprobe = ", n, " * ", nprobe,
                     " exceeds ", kMaxQueryProbes));
  }
  if (args.allowed_lists != nullptr &&
      (args.allowed_rows == nullptr ||
       args.allowed_lists->nlist() != static_cast<int64_t>(parts_.ivf->nlist))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", name_, ": filtered lists of ",
        args.allowed_lists->nlist(), " lists given for an index of ",
        parts_.ivf->nlist, args.allowed_rows == nullptr ? ", without rows" : ""));
  }
  if (args.allowed_lists_flat &&
      (args.allowed_lists == nullptr || parts_.ivf->by_residual)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", name_, ": the flat plan needs filtered lists and codes "
        "that are not residuals"));
  }
  if (args.probe_reference != nullptr &&
      (args.reference_nprobe < 1 || args.reference_k < 0 ||
       args.reference_rank < args.reference_k || args.reference_rank > kMaxK ||
       (args.reference_k == 0) != (args.reference_rank == 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search of ", name_, ": probe_reference with reference_nprobe=",
        args.reference_nprobe, " (not >= 1), or reference_k=", args.reference_k,
        " and reference_rank=", args.reference_rank,
        " not 1 <= reference_k <= reference_rank <= ", kMaxK, " nor both 0"));
  }
  if (args.skip_probes < 0 || args.skip_probes >= nprobe) {
    return absl::InvalidArgumentError(
        absl::StrCat("search of ", name_, ": skip_probes=", args.skip_probes,
                     " is outside [0, ", nprobe, ") (nprobe)"));
  }
  if (n == 0) return absl::OkStatus();
  const IdFilter filter(args);
  ProbeReference* const reference = filter.active() && !args.allowed_lists_flat
                                        ? args.probe_reference
                                        : nullptr;
  return faiss_types::CatchFaiss(
      absl::StatusCode::kInternal, absl::StrCat("search of ", name_), [&] {
        return SearchImpl(
            static_cast<size_t>(n), args.queries, static_cast<size_t>(args.k),
            static_cast<size_t>(nprobe), static_cast<size_t>(args.skip_probes),
            filter.active() ? &filter : nullptr, args.allowed_lists,
            args.allowed_lists_flat, reference,
            static_cast<size_t>(args.reference_nprobe),
            static_cast<size_t>(args.reference_k),
            static_cast<size_t>(args.reference_rank), args.distances, args.ids);
      });
}

absl::Status FastScanSearcher::SearchImpl(
    size_t n, const float* x_in, size_t k, size_t nprobe, size_t skip,
    const IdFilter* filter, const FilteredLists* admitted, bool flat,
    ProbeReference* reference, size_t ref_nprobe, size_t ref_k, size_t ref_rank,
    float* distances, int64_t* labels) const {
  const faiss::IndexIVFPQFastScan& ivf = *parts_.ivf;

  // Pre-transform (PCA, OPQ, ...), as IndexPreTransform::search does.
  const float* x = x_in;
  std::unique_ptr<const float[]> transformed;
  if (parts_.layers.pre != nullptr) {
    x = parts_.layers.pre->apply_chain(n, x_in);
    if (x != x_in) transformed.reset(x);
  }
  const size_t d = ivf.d;
  const bool l2 = ivf.metric_type == faiss::METRIC_L2;
  if (flat) {  // one table per query, no coarse search
    const size_t nslice = NumSlices(ivf, n, 1);
    QuantizedLuts luts;
    for (size_t s = 0; s < nslice; ++s) {
      const size_t i0 = n * s / nslice, i1 = n * (s + 1) / nslice;
      if (i1 == i0) continue;
      ComputeQuantizedLuts(ivf, centroids_by_dim_, i1 - i0, x + i0 * d,
                           nullptr, nullptr, 1, &luts);
      if (l2) {
        ScanAdmittedRows<true>(ivf, i1 - i0, k, luts, *admitted,
                               distances + i0 * k, labels + i0 * k);
      } else {
        ScanAdmittedRows<false>(ivf, i1 - i0, k, luts, *admitted,
                                distances + i0 * k, labels + i0 * k);
      }
    }
    return absl::OkStatus();
  }
  const size_t nslice = NumSlices(ivf, n, nprobe);
  std::vector<idx_t> coarse_ids;
  std::vector<float> coarse_dis;
  QuantizedLuts luts;
  for (size_t s = 0; s < nslice; ++s) {
    const size_t i0 = n * s / nslice, i1 = n * (s + 1) / nslice;
    const size_t ns = i1 - i0;
    if (ns == 0) continue;
    const float* xs = x + i0 * d;
    float* ds = distances + i0 * k;
    idx_t* ls = labels + i0 * k;

    coarse_ids.resize(ns * nprobe);
    coarse_dis.resize(ns * nprobe);
    if (coarse_l2::Applies(*ivf.quantizer, ns, nprobe)) {
      const bool have_norms = centroid_norms_.size() ==
                              static_cast<size_t>(ivf.quantizer->ntotal);
      coarse_l2::Search(*ivf.quantizer, ns, xs, nprobe, coarse_dis.data(),
                        coarse_ids.data(),
                        have_norms ? centroid_norms_.data() : nullptr);
    } else {
      ivf.quantizer->search(ns, xs, nprobe, coarse_dis.data(),
                            coarse_ids.data());
    }
    for (const idx_t list : coarse_ids) {
      if (list >= static_cast<idx_t>(ivf.nlist)) {
        return absl::InternalError(absl::StrCat(
            "search of ", name_, ": coarse quantizer returned list ", list,
            " of nlist ", ivf.nlist));
      }
    }
    ComputeQuantizedLuts(ivf, centroids_by_dim_, ns, xs, coarse_ids.data(),
                         coarse_dis.data(), nprobe, &luts);
    const std::vector<Probe> probes =
        SortedProbes(ns, nprobe, coarse_ids.data(), skip);
    if (reference != nullptr) {
      RecordReference(ivf, ns, nprobe, ref_nprobe, ref_k, ref_rank, luts,
                      coarse_ids.data(), coarse_dis.data(), reference + i0);
    }
    if (filter != nullptr) {
      if (l2) {
        ScanFiltered<true>(ivf, ns, k, nprobe, luts, probes, *filter, admitted,
                           ds, ls);
      } else {
        ScanFiltered<false>(ivf, ns, k, nprobe, luts, probes, *filter,
                            admitted, ds, ls);
      }
    } else if (l2) {
      ScanUnfiltered<faiss::CMax<uint16_t, int64_t>>(ivf, ns, k, nprobe, luts,
                                                     probes, ds, ls);
    } else {
      ScanUnfiltered<faiss::CMin<uint16_t, int64_t>>(ivf, ns, k, nprobe, luts,
                                                     probes, ds, ls);
    }
  }
  return absl::OkStatus();
}

}  // namespace knnd
