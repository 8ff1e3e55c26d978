// FastScanSearcher: search of an IVF-PQ FastScan index (4-bit codes) with
// per-call parameters (nprobe, id filter), const and safe to call from many
// threads at once. Internal to src/faiss/ (FastScanIndex, behind ServingIndex, routes here).
#ifndef KNND_FAISS_FASTSCAN_SEARCH_H_
#define KNND_FAISS_FASTSCAN_SEARCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/faiss/fastscan_checks.h"
#include "knnd/faiss/id_filter.h"
#include "knnd/faiss/search_args.h"

namespace knnd {

// Searches an IndexIVFPQFastScan (alone or under an IndexPreTransform) the
// way IndexIVFFastScan::search does (FAISS 1.7.3, implementations 12/13:
// coarse search, quantized look-up tables, queries grouped by list), but with
// nprobe and an optional id filter given per call instead of read from the
// index, and without touching FAISS's global statistics (indexIVF_stats,
// IVFFastScan_stats), which FAISS writes without synchronisation.
//
// Without a filter it drives FAISS's own compiled SIMD kernel
// (pq4_accumulate_loop_qbs) and result handlers: labels equal (for k > 20,
// where the results come from reservoirs, up to the order of equal
// distances: knnd sorts the reservoirs by a stable radix sort, FAISS by
// std::sort), and distances
// equal up to float rounding of the final rescaling, what FAISS returns with
// index->nprobe set to the same value, for any batch size, when FAISS's
// own search runs one OpenMP thread (it splits batches by thread count).
// With a filter it uses knnd's kernel (fastscan_kernel.h) on the same
// quantized tables and returns the best k among the allowed ids of the
// probed lists (ties at the k-th distance broken by scan order); with the
// filter's lists (SearchArgs::allowed_lists) it scans those instead, with
// the same results, or, with allowed_lists_flat, every row of them.
// A query with fewer than k candidates gets id -1 in the remaining slots,
// with a distance that means nothing (ServingIndex::Search replaces it).
//
// Ownership: borrows the index, which must outlive the searcher.
// Thread-safety: Search() is const and keeps all its state on the calling
// thread; any number of threads may search one searcher concurrently. It
// calls FAISS's coarse quantizer (BLAS from 20 queries up): OpenBLAS runs
// one thread in knnd (faiss_runtime.h).
class FastScanSearcher {
 public:
  // `name` (the index file) is used in error messages. FAILED_PRECONDITION
  // when the index is not a FastScan index knnd serves (fastscan_checks.h),
  // has no lists, or when this file was compiled with other SIMD settings
  // than the FAISS library (their kernel and handler types would differ).
  static absl::StatusOr<std::unique_ptr<FastScanSearcher>> Create(
      const faiss::Index* index, std::string name);

  // Searches args.num_queries queries of dimension index->d (row-major in
  // args.queries) with args.k results each (>= 1) from args.nprobe lists
  // (>= 1, capped at nlist; those after the first args.skip_probes), only
  // among args.allowed_ids when that is not empty; writes num_queries * k
  // distances and ids, each query's results best first, and with a filter
  // args.probe_reference when it is set. The re-ranking fields are not
  // read. INVALID_ARGUMENT for bad arguments; a FAISS error is INTERNAL.
  absl::Status Search(const SearchArgs& args) const;

 private:
  FastScanSearcher(FastScanParts parts, std::vector<float> centroids_by_dim,
                   std::vector<float> centroid_norms, std::string name)
      : parts_(std::move(parts)),
        centroids_by_dim_(std::move(centroids_by_dim)),
        centroid_norms_(std::move(centroid_norms)),
        name_(std::move(name)) {}

  // Search() after its checks, the lists of ranks [skip, nprobe) of each
  // query; `filter` null: every id is allowed;
  // `admitted` (with a filter): the filter's lists, scanned instead; with
  // `flat`, all of them without the coarse search; `reference` (with a
  // filter, not flat): n entries filled as SearchArgs::probe_reference
  // says, at ref_nprobe, ref_k and ref_rank.
  absl::Status SearchImpl(size_t n, const float* x, size_t k, size_t nprobe,
                          size_t skip, const IdFilter* filter,
                          const FilteredLists* admitted, bool flat,
                          ProbeReference* reference, size_t ref_nprobe,
                          size_t ref_k, size_t ref_rank, float* distances,
                          int64_t* labels) const;

  const FastScanParts parts_;
  // The PQ centroids by dimension where knnd computes the float tables
  // itself (fastscan_lut::D4TablesApply: 4-dim sub-vectors, AVX2); empty
  // where FAISS does. pq.M * 64 floats (50 KiB for Fashion-MNIST's M 196).
  const std::vector<float> centroids_by_dim_;
  // The coarse centroids' squared norms (coarse_l2::CentroidNorms), for
  // the coarse search of many queries; empty where it does not apply.
  const std::vector<float> centroid_norms_;
  const std::string name_;
};

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_SEARCH_H_
