// The anonymous-memory cost model of knnd (docs/sizing.md explains it):
// what one search request holds while admitted, what an index needs
// on the heap, whether an index fits the memory limit, and the byte budget
// the AdmissionGate enforces.
//
//   anonymous = index heap (centroids + PQ codebooks + pre-transforms
//                           + precomputed table nlist * M * 2^nbits * 4
//                           + the filter cache's bound, with attributes)
//             + bytes admitted by the gate (<= max_inflight_bytes)
//             + a fixed base (code, gRPC, thread stacks, allocator slack)
//   file-backed (page cache, reclaimable) = the mapped inverted lists
//             (IVF-PQ: codes + ids; FastScan: codes in 32-vector blocks,
//             padded, + ids), the raw vectors for re-ranking
//             (ntotal * d * 4 or 2), with own ids the id table
//             (ntotal * 24: row -> id, sorted ids, their rows), and the
//             payloads (INDEX.payloads: the rows' JSON fields)
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_MEMORY_MODEL_H_
#define KNND_INDEX_MEMORY_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {

struct SearchShape {
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 0;
  int64_t filter_ids = 0;
  int refine_factor = 0;
  // Rows per FAISS call (the batcher's max_batch_rows); 0: one call for the
  // whole request. Each call has its own per-thread tables.
  int64_t unit_rows = 0;
  // The most bytes of payloads the answer may carry (SearchRequest.payloads;
  // PayloadBytesBound()); 0: none asked for.
  int64_t payload_bytes = 0;
  // With an attribute filter: its rows (SearchArgs::allowed_rows), and how
  // many of them are set.
  bool filtered = false;
  int64_t filter_matched_rows = 0;
  // Whether the request holds a bitmap of the index's rows of its own:
  // false for one numeric condition searched through its bounds
  // (SearchArgs::allowed_range), which allocates none, and for a bitmap
  // the filter cache holds (counted in the index's heap).
  bool filter_bitmap = true;
  // The request's float32 copy of its query matrix, when it holds one:
  // vectors_f16le / vectors_bf16le widened, or vectors_f32le not aligned
  // for floats (ParsedSearch::aligned_copy). 0: searched in place.
  int64_t query_copy_bytes = 0;
  // A hybrid request (SearchRequest.texts): the text retriever's window,
  // and `k` is then the vector retriever's window (at least the answer's
  // k). 0: no texts.
  int text_window = 0;
};

// The most bytes the payloads of `entries` results can add to an answer:
// entries * the index's largest row payload, but never more than
// `max_send_message_bytes` (a larger answer is refused before it is built).
int64_t PayloadBytesBound(const IndexInfo& index, int64_t entries,
                          int64_t max_send_message_bytes);

// Upper estimate, in bytes, of the heap a request holds while admitted:
//   request vectors            nq * d * 4 (plus a transformed copy of
//                              nq * max(d, ivf_dim) * 4 with a
//                              pre-transform or cosine normalisation,
//                              and query_copy_bytes: the float32 copy of
//                              16-bit or unaligned vectors)
//   response ids + distances   nq * k * (8 + 4), in the message, and as much
//                              again for its serialised copy
//   coarse assignment          nq * nprobe * (8 + 4)
//   coarse-search temporaries  the BLAS distance block of the coarse search:
//                              nq * min(nlist, 1024) * 4 (FAISS computes it
//                              for calls of >= 20 rows) + nlist * 4 norms
//   allow-list                 filter_ids * 8 * 2 (message + sorted copy;
//                              the search borrows the sorted copy), and
//                              with an id table filter_ids * 8 per FAISS
//                              call (the allowed ids' rows)
//   attribute filter           ntotal / 8 (its row bitmap, unless the
//                              filter cache holds it), and per FAISS
//                              call matched rows * 8 (the exact plan's
//                              rows) or the IVF plan's copy of the rows it
//                              widens, unit rows * (d * 4 + k * 12),
//                              whichever is larger
//   re-ranking candidates      nq * refine_factor * k * (8 + 4)
//   payloads                   2 * payload_bytes (the answer's JSON
//                              objects and their serialised copy)
//   text retrieval             per FAISS call ntotal * 24 (the BM25 score
//                              of every row, 4 bytes, the rows touched, 4,
//                              and their hits, 16: at worst every row), and nq
//                              * (k + text_window) * 56 (both windows, the
//                              fusion's candidates and their ranks and scores
//                              in the answer)
// and the search's own buffers, by kind of index. IVF-PQ (FAISS's search):
//   FAISS result heaps         nq * k * 12 while a unit runs
//   per-thread PQ tables       2 * M * 2^nbits * 4 + 2 * d * 4 per FAISS call
//                              (QueryTables' sim_table and sim_table_2; with
//                              the precomputed table on, the per-list tables
//                              are computed into these same buffers, FAISS
//                              1.7.3 keeps no nprobe * M * 2^nbits table)
// FastScan (fastscan_search.cc), with L = nprobe when the codes are L2
// residuals (one table per probed list) and 1 otherwise, M2 = 2 * code_size:
//   float look-up tables       nq * L * 16 * M * 4
//   residual tables            L2 residuals: with the precomputed table
//                              nq * 16 * M * 4 (inner products with the
//                              codebooks), without it nq * nprobe * ivf_dim
//                              * 4 (the residuals)
//   biases                     residuals: nq * nprobe * (4 + 2)
//   quantized tables           nq * L * 16 * M2 (uint8) + nq * 8 (scales)
//   probes sorted by list      nq * nprobe * 12
//   result handler             nq * (round_up(2k, 16) * (2 + 8) + 64): FAISS's
//                              reservoir of 2k uint16 distances and ids per
//                              query (k > 20; the heap and the filtered
//                              scan's heap are smaller)
//   per FAISS call             24 * 16 * M2 (the grouped table of <= 24
//                              queries) + k * 4 (the handler's sort order)
int64_t EstimateSearchBytes(const IndexInfo& index, const SearchShape& shape);

// PrecomputedTableBytes() (faiss/serving_index.h) gives the IVF-PQ
// precomputed table's bytes.

// The most heap an index holds while it loads: heap_bytes, or more when
// FAISS's reader briefly held more than the table kept
// (IndexFacts::read_peak_extra_bytes).
int64_t LoadPeakHeapBytes(const IndexInfo& planned);

// The memory knnd must stay within.
struct MemoryLimits {
  // The container's (cgroup's) limit or the configured one; 0: none known.
  int64_t limit_bytes = 0;
  // Anonymous memory kept free for everything outside the model: code,
  // gRPC, thread stacks, allocator slack.
  int64_t headroom_bytes = 0;
};

// OK when an index whose load needs LoadPeakHeapBytes(planned) fits beside
// `other_heap_bytes` (a version still serving during a hot swap) and the
// headroom; otherwise
// RESOURCE_EXHAUSTED naming the sizes, the limit and the knobs that help.
// Always OK without a limit.
absl::Status CheckIndexFits(const IndexInfo& planned, int64_t other_heap_bytes,
                            const MemoryLimits& limits);

// The gate's byte budget: `percent` of (limit - index heap - headroom) when a
// limit is known, else `fixed_bytes` (0: unbounded). Never below 1 with a
// limit, so that a tight limit refuses requests rather than lifting the
// bound.
int64_t InflightBytesBudget(const MemoryLimits& limits,
                            int64_t index_heap_bytes, int percent,
                            int64_t fixed_bytes);

}  // namespace knnd

#endif  // KNND_INDEX_MEMORY_MODEL_H_
