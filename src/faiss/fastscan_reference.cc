#include "knnd/faiss/fastscan_reference.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>

#include "knnd/faiss/fastscan_kernel.h"

namespace knnd {
namespace {

// Blocks of 32 codes of a query's closest list that RecordReference
// estimates: a whole list's estimates cost as much as the scan of a kept
// filter's matches in a 1% or 10% filter's lists (100k x 128, 316 rows a
// list), 128 rows a fifth of that.
constexpr size_t kReferenceBlocks = 4;

}  // namespace

void RecordReference(const faiss::IndexIVFPQFastScan& ivf, size_t n,
                     size_t nprobe, size_t ref_nprobe, size_t ref_k,
                     size_t ref_rank, const fastscan_lut::QuantizedLuts& luts,
                     const faiss::Index::idx_t* coarse_ids,
                     const float* coarse_dis, ProbeReference* reference) {
  const size_t anchor = std::min(ref_nprobe, nprobe) - 1;
  for (size_t q = 0; q < n; ++q) {
    reference[q].frontier = coarse_dis[q * nprobe + nprobe - 1];
    reference[q].anchor = coarse_dis[q * nprobe + anchor];
  }
  if (ref_rank == 0) return;
  const bool keep_min = ivf.metric_type == faiss::METRIC_L2;
  const float missing = keep_min ? std::numeric_limits<float>::infinity()
                                 : -std::numeric_limits<float>::infinity();
  const size_t dim12_2 = ivf.ksub * ivf.M2;
  const size_t block_bytes = 16 * ivf.M2;
  std::vector<uint16_t> estimates;
  for (size_t q = 0; q < n; ++q) {
    ProbeReference& r = reference[q];
    r.nearest_kth = r.nearest_rank = missing;
    const faiss::Index::idx_t list = coarse_ids[q * nprobe];
    if (list < 0) continue;
    const size_t size = ivf.invlists->list_size(list);
    if (size == 0) continue;
    const size_t ij = q * nprobe;
    const uint8_t* lut = luts.tables.get() + (luts.is_3d ? ij : q) * dim12_2;
    const uint16_t bias = luts.has_bias ? luts.biases[ij] : 0;
    // At most kReferenceBlocks blocks of the list, its first rows (rows
    // go to lists in the order they come, so they are a sample of its
    // rows), the ranks scaled to their share of the list.
    const size_t sampled = std::min(size, kReferenceBlocks * 32);
    const auto scaled = [&](size_t rank) {
      return std::max<size_t>(1, (rank * sampled + size - 1) / size);
    };
    faiss::InvertedLists::ScopedCodes codes(ivf.invlists, list);
    estimates.resize((sampled + 31) / 32 * 32);
    for (size_t b = 0; b * 32 < sampled; ++b) {
      fastscan_kernel::BlockDistances(codes.get() + b * block_bytes, ivf.M2,
                                      lut, bias, estimates.data() + b * 32);
    }
    estimates.resize(sampled);
    // Best first (the smallest estimates for L2, the largest otherwise):
    // the ref_rank-th, then the ref_k-th among the ref_rank best.
    const auto nth = [&](size_t rank, size_t among) {
      const size_t i = std::min(rank, sampled) - 1;
      const auto end = estimates.begin() + std::min(among, sampled);
      if (keep_min) {
        std::nth_element(estimates.begin(), estimates.begin() + i, end);
      } else {
        std::nth_element(estimates.begin(), estimates.begin() + i, end,
                         std::greater<uint16_t>());
      }
      return estimates[i] / luts.normalizers[2 * q] +
             luts.normalizers[2 * q + 1];
    };
    r.nearest_rank = nth(scaled(ref_rank), sampled);
    r.nearest_kth = nth(scaled(ref_k), scaled(ref_rank));
  }
}

}  // namespace knnd
