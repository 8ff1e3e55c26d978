#include "knnd/index/memory_model.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "knnd/base/saturating.h"
#include "knnd/base/units.h"
#include "knnd/faiss/search_args.h"
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
  int64_t bytes = SatAdd(
      SatMul(nq, tables_per_query, SatAdd(SatMul(lut, 4), lut2)),
      SatMul(nq, 8));
  if (l2_residual) {
    bytes = SatAdd(
        bytes, index.precomputed_table_bytes > 0
                   ? SatMul(nq, lut, 4)
                   : SatMul(nq, nprobe,
                            std::max<int64_t>(index.dim, index.ivf_dim), 4));
  }
  if (index.by_residual) bytes = SatAdd(bytes, SatMul(nq, nprobe, 4 + 2));
  bytes = SatAdd(bytes, SatMul(nq, nprobe, 12));
  // FAISS's reservoir of 2k: round_up(2k, 16) * (2 + 8) + 64 per query.
  const int64_t reservoir =
      SatMul(SatAdd(SatMul(2, k), 15) / 16, 16 * (2 + 8));
  bytes = SatAdd(bytes, SatMul(nq, SatAdd(reservoir, 64)));
  bytes = SatAdd(bytes, SatMul(calls, SatAdd(kMaxFastScanQueryGroup * lut2,
                                             SatMul(k, 4))));
  return bytes;
}

}  // namespace

int64_t EstimateSearchBytes(const IndexInfo& index, const SearchShape& shape) {
  // Every product and sum saturates (base/saturating.h): the shape's
  // values are the caller's, checked against limits an operator may set
  // far apart, and a wrapped estimate would let the gate admit anything.
  const int64_t nq = std::max<int64_t>(0, shape.num_queries);
  const int64_t d = index.dim;
  const int64_t k = std::max(0, shape.k);
  const int64_t nprobe = std::max(0, shape.nprobe);
  int64_t bytes = SatAdd(SatMul(nq, d, 4), shape.query_copy_bytes);
  if (index.has_pretransform || index.metric == Metric::kCosine) {
    // A transformed copy.
    bytes = SatAdd(bytes,
                   SatMul(nq, std::max<int64_t>(d, index.ivf_dim), 4));
  }
  bytes = SatAdd(bytes, SatMul(2, nq, k, 12));
  bytes = SatAdd(bytes, SatMul(nq, nprobe, 12));
  const int64_t rows = shape.unit_rows > 0 ? std::min(nq, shape.unit_rows)
                                           : nq;
  if (rows >= kBlasThresholdRows) {
    bytes = SatAdd(bytes,
                   SatMul(nq, std::min(index.nlist, kBlasDatabaseBlock), 4));
  }
  bytes = SatAdd(bytes, SatMul(index.nlist, 4));
  const int64_t calls = std::max<int64_t>(
      1, shape.unit_rows > 0 ? SatAdd(nq, shape.unit_rows - 1) / shape.unit_rows
                             : 1);
  SearchShape clean = shape;
  clean.num_queries = nq;
  clean.k = static_cast<int>(k);
  clean.nprobe = static_cast<int>(nprobe);
  if (index.fastscan) {
    bytes = SatAdd(bytes, FastScanSearchBytes(index, clean, calls));
  } else {
    bytes = SatAdd(bytes, SatMul(nq, k, 12));
    const int64_t tables =
        SatAdd(SatMul(2 * int64_t{index.pq_m},
                      int64_t{1} << std::clamp(index.pq_nbits, 0, 32), 4),
               SatMul(2, d, 4));
    bytes = SatAdd(bytes, SatMul(calls, tables));
  }
  const int64_t filter_ids = std::max<int64_t>(0, shape.filter_ids);
  bytes = SatAdd(bytes, SatMul(filter_ids, 16));
  // With an id table every call translates the allow-list into rows.
  if (index.has_id_table) bytes = SatAdd(bytes, SatMul(calls, filter_ids, 8));
  const int64_t kc = SatMul(shape.refine_factor, k);
  // FAISS's kc + slack best (CandidateSlack, without int overflow).
  const int64_t fetched = shape.refine_factor > 0 ? SatAdd(kc, kc / 4 + 8) : k;
  if (shape.filtered) {
    // The filter's bitmap, when it has one; per call the exact plan's list
    // ids of the matching rows or the IVF plan's copies of the queries it
    // widens with their results, the ids it compares, their
    // ProbeReference and the best rows of their closest list
    // (filter_planner.h).
    if (shape.filter_bitmap) {
      bytes = SatAdd(bytes, SatMul(RowBitmap::WordsFor(index.ntotal), 8));
    }
    const int64_t reference_rows = ReferenceRank(
        static_cast<int>(k), shape.filter_matched_rows, index.ntotal);
    const int64_t widened_row = SatAdd(
        SatAdd(SatMul(d, 4), SatMul(fetched, 12 + 8)),
        SatAdd(int64_t{sizeof(ProbeReference)}, SatMul(reference_rows, 12)));
    bytes = SatAdd(bytes,
                   SatMul(calls, std::max(SatMul(shape.filter_matched_rows, 8),
                                          SatMul(rows, widened_row))));
  }
  if (shape.refine_factor > 0) {
    // FAISS's kc + slack best and the kc kept (rerank.h), 12 bytes each;
    // a filtered search keeps and re-ranks all kc + slack.
    bytes = SatAdd(
        bytes, SatMul(nq, SatAdd(fetched, shape.filtered ? fetched : kc), 12));
  }
  bytes = SatAdd(bytes, SatMul(2, std::max<int64_t>(0, shape.payload_bytes)));
  if (shape.text_window > 0) {
    bytes = SatAdd(bytes, SatMul(calls, index.ntotal, 24));
    bytes = SatAdd(bytes, SatMul(nq, SatAdd(k, shape.text_window), 56));
  }
  return bytes;
}

int64_t PayloadBytesBound(const IndexInfo& index, int64_t entries,
                          int64_t max_send_message_bytes) {
  if (entries <= 0 || index.max_payload_json_bytes <= 0) return 0;
  return std::min(SatMul(entries, index.max_payload_json_bytes),
                  max_send_message_bytes);
}

int64_t LoadPeakHeapBytes(const IndexInfo& planned) {
  return SatAdd(planned.heap_bytes,
                std::max<int64_t>(0, SatSub(planned.read_peak_extra_bytes,
                                            planned.precomputed_table_bytes)));
}

absl::Status CheckIndexFits(const IndexInfo& planned, int64_t other_heap_bytes,
                            const MemoryLimits& limits) {
  if (limits.limit_bytes <= 0) return absl::OkStatus();
  const int64_t peak = LoadPeakHeapBytes(planned);
  const int64_t need =
      SatAdd(SatAdd(peak, other_heap_bytes), limits.headroom_bytes);
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
  const int64_t free_bytes = SatSub(
      SatSub(limits.limit_bytes, index_heap_bytes), limits.headroom_bytes);
  return std::max<int64_t>(1, SatMul(free_bytes / 100, percent));
}

}  // namespace knnd
