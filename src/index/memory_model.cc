#include "knnd/index/memory_model.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "knnd/base/units.h"
#include "knnd/index/filter_planner.h"
#include "knnd/index/rerank.h"

namespace knnd {
namespace {

// FAISS 1.7.3 (utils/distances.cpp) computes L2 distances with BLAS from
// this many query rows on, in blocks of up to 1024 database vectors.
constexpr int64_t kBlasThresholdRows = 20;
constexpr int64_t kBlasDatabaseBlock = 1024;
// FAISS's FastScan kernels take at most this many queries per list group.
constexpr int64_t kMaxFastScanQueryGroup = 24;

// FastScanSearcher's own buffers (memory_model.h lists them).
int64_t FastScanSearchBytes(const IndexInfo& index, const SearchShape& shape,
                            int64_t calls) {
  const int64_t nq = shape.num_queries;
  const int64_t nprobe = shape.nprobe;
  const int64_t k = shape.k;
  const int64_t lut = 16 * int64_t{index.pq_m};
  const int64_t lut2 = 16 * 2 * index.code_size_bytes;
  const bool l2_residual = index.by_residual && index.metric == Metric::kL2;
  const int64_t tables_per_query = l2_residual ? nprobe : 1;
  int64_t bytes = nq * tables_per_query * (lut * 4 + lut2) + nq * 8;
  if (l2_residual) {
    bytes += index.precomputed_table_bytes > 0
                 ? nq * lut * 4
                 : nq * nprobe * std::max(index.dim, index.ivf_dim) * 4;
  }
  if (index.by_residual) bytes += nq * nprobe * (4 + 2);
  bytes += nq * nprobe * 12;
  bytes += nq * (((2 * k + 15) / 16 * 16) * (2 + 8) + 64);
  bytes += calls * (kMaxFastScanQueryGroup * lut2 + k * 4);
  return bytes;
}

}  // namespace

int64_t EstimateSearchBytes(const IndexInfo& index, const SearchShape& shape) {
  const int64_t nq = shape.num_queries;
  const int64_t d = index.dim;
  const int64_t k = shape.k;
  int64_t bytes = nq * d * 4 + shape.query_copy_bytes;
  if (index.has_pretransform || index.metric == Metric::kCosine) {
    bytes += nq * std::max<int64_t>(d, index.ivf_dim) * 4;  // a transformed copy
  }
  bytes += 2 * nq * k * 12;
  bytes += nq * shape.nprobe * 12;
  const int64_t rows = shape.unit_rows > 0 ? std::min(nq, shape.unit_rows)
                                           : nq;
  if (rows >= kBlasThresholdRows) {
    bytes += nq * std::min(index.nlist, kBlasDatabaseBlock) * 4;
  }
  bytes += index.nlist * 4;
  const int64_t calls = std::max<int64_t>(
      1, shape.unit_rows > 0 ? (nq + shape.unit_rows - 1) / shape.unit_rows : 1);
  if (index.fastscan) {
    bytes += FastScanSearchBytes(index, shape, calls);
  } else {
    bytes += nq * k * 12;
    bytes += calls *
             (2 * int64_t{index.pq_m} * (int64_t{1} << index.pq_nbits) * 4 +
              2 * d * 4);
  }
  bytes += shape.filter_ids * 16;
  // With an id table every call translates the allow-list into rows.
  if (index.has_id_table) bytes += calls * shape.filter_ids * 8;
  const int kc = static_cast<int>(shape.refine_factor * k);
  const int64_t fetched =
      shape.refine_factor > 0 ? kc + CandidateSlack(kc) : k;
  if (shape.filtered) {
    // The filter's bitmap, when it has one; per call the exact plan's list
    // ids of the matching rows or the IVF plan's copies of the queries it
    // widens with their results, the ids it compares, their
    // ProbeReference and the best rows of their closest list
    // (filter_planner.h).
    if (shape.filter_bitmap) bytes += RowBitmap::WordsFor(index.ntotal) * 8;
    const int64_t reference_rows =
        ReferenceRank(k, shape.filter_matched_rows, index.ntotal);
    bytes += calls * std::max(shape.filter_matched_rows * 8,
                              rows * (d * 4 + fetched * (12 + 8) +
                                      int64_t{sizeof(ProbeReference)} +
                                      reference_rows * 12));
  }
  if (shape.refine_factor > 0) {
    // FAISS's kc + slack best and the kc kept (rerank.h), 12 bytes each;
    // a filtered search keeps and re-ranks all kc + slack.
    bytes += nq * (fetched + (shape.filtered ? fetched : kc)) * 12;
  }
  bytes += 2 * shape.payload_bytes;
  return bytes;
}

int64_t PayloadBytesBound(const IndexInfo& index, int64_t entries,
                          int64_t max_send_message_bytes) {
  if (entries <= 0 || index.max_payload_json_bytes <= 0) return 0;
  if (index.max_payload_json_bytes > max_send_message_bytes / entries) {
    return max_send_message_bytes;
  }
  return entries * index.max_payload_json_bytes;
}

int64_t LoadPeakHeapBytes(const IndexInfo& planned) {
  return planned.heap_bytes +
         std::max<int64_t>(0, planned.read_peak_extra_bytes -
                                  planned.precomputed_table_bytes);
}

absl::Status CheckIndexFits(const IndexInfo& planned, int64_t other_heap_bytes,
                            const MemoryLimits& limits) {
  if (limits.limit_bytes <= 0) return absl::OkStatus();
  const int64_t peak = LoadPeakHeapBytes(planned);
  const int64_t need = peak + other_heap_bytes + limits.headroom_bytes;
  if (need <= limits.limit_bytes) return absl::OkStatus();
  std::string reading;
  if (peak > planned.heap_bytes) {
    reading = absl::StrFormat(
        " + %.1f MiB that FAISS's reader holds while it reads the file",
        MiB(peak - planned.heap_bytes));
  }
  std::string other;
  if (other_heap_bytes > 0) {
    other = absl::StrFormat(" + %.1f MiB of the version still serving",
                            MiB(other_heap_bytes));
  }
  std::string advice;
  if (planned.precomputed_table_bytes > 0) {
    advice = absl::StrFormat(
        ", or set use_precomputed_table: false (saves %.1f MiB)",
        MiB(planned.precomputed_table_bytes));
  }
  std::string cache;
  if (planned.filter_cache_bytes > 0) {
    cache = absl::StrFormat(" + filter cache %.1f MiB",
                            MiB(planned.filter_cache_bytes));
    absl::StrAppendFormat(&advice, ", or lower filter_cache_bytes (%.1f MiB)",
                          MiB(planned.filter_cache_bytes));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "index %s needs %.1f MiB of heap (centroids, codebooks and "
      "pre-transforms %.1f MiB + precomputed table %.1f MiB%s)%s%s + "
      "memory_headroom_bytes %.1f MiB = %.1f MiB, more than the memory limit "
      "of %.1f MiB; raise the limit, lower memory_headroom_bytes, serve a "
      "smaller index (fewer lists or sub-quantizers)%s",
      planned.path, MiB(planned.heap_bytes),
      MiB(planned.heap_bytes - planned.precomputed_table_bytes -
          planned.filter_cache_bytes),
      MiB(planned.precomputed_table_bytes), cache, reading, other,
      MiB(limits.headroom_bytes), MiB(need), MiB(limits.limit_bytes),
      advice));
}

int64_t InflightBytesBudget(const MemoryLimits& limits,
                            int64_t index_heap_bytes, int percent,
                            int64_t fixed_bytes) {
  if (limits.limit_bytes <= 0) return fixed_bytes;
  const int64_t free_bytes =
      limits.limit_bytes - index_heap_bytes - limits.headroom_bytes;
  return std::max<int64_t>(1, free_bytes / 100 * percent);
}

}  // namespace knnd
