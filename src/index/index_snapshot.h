// IndexSnapshot: one loaded, immutable version of an index: a FAISS IVF-PQ
// file or a knnd FastScan file (4-bit IVF-PQ FastScan in knnd's mappable
// layout, faiss/fastscan_format.h), both through faiss/serving_index.h.
//
// The inverted lists (the bulk of the index) are memory-mapped read-only from
// the file, so they live in the shared, reclaimable page cache; only the
// coarse centroids, the PQ codebooks and the optional precomputed table are
// on the heap. The index of either kind is faiss/serving_index.h's; the probe
// process is index_probe.h's, exact re-ranking rerank.h's.
//
// With a raw-vectors file beside the index (vectors_file.h) it can re-rank
// IVF-PQ candidates by exact distance; the snapshot owns that mapping too,
// so a pinned snapshot keeps its vectors mapped and a swapped-out one unmaps
// them when its last search ends. Likewise the id table (id_table.h) of an
// index built with its own ids, through which it translates between the
// rows its lists hold and the ids of requests and answers (list_ids.h),
// and the payloads (payload_file.h) of an index built with them, from
// which it cuts the fields a request asks for by the answers' ids.
// And the attribute store (storage/attribute_store.h) of an index built
// with attributes, over which request filters compile
// (attribute_filter.h); filtered searches are planned by filter_planner.h.
//
// Thread-safety: an IndexSnapshot is immutable after Load(); Search() is const
// and safe to call from any number of threads at once. Per-call parameters
// (nprobe, the id filter) travel in the call, never in shared state.
#ifndef KNND_INDEX_INDEX_SNAPSHOT_H_
#define KNND_INDEX_INDEX_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "knnd/base/metric.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/filtered_lists.h"
#include "knnd/faiss/serving_index.h"
#include "knnd/index/attribute_filter.h"
#include "knnd/index/filter_cache.h"
#include "knnd/index/filter_planner.h"
#include "knnd/index/list_ids.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/text/text_index.h"

namespace knnd {

struct PreparedFilter;  // prepared_filter.h

// What is known about a loaded index: what the file says (IndexFacts),
// then its version, sidecar and vectors file. Filled by Load(), then
// constant.
struct IndexInfo : IndexFacts {
  int64_t version = 0;
  absl::Time load_time = absl::InfinitePast();
  absl::Duration load_duration;
  // From the metadata sidecar (index_metadata.h) when the file has one, whose
  // checksum then matched (unless Load() ran without verify_checksum: then
  // VerifyChecksums() checks it later); empty / false without one.
  bool has_metadata = false;
  std::string sidecar_crc32;       // the file's CRC-32 the sidecar records
  int64_t sidecar_file_bytes = 0;  // and its size
  bool normalized = false;  // vectors L2-normalised at build (metric cosine)
  std::string factory;      // as given to the builder, e.g. "IVF1024,PQ56"
  std::string source;       // input file of the build
  std::string created;      // RFC 3339 UTC
  // The sidecar's `knnctl tune` result (tuned_nprobe 0: not tuned).
  int tuned_nprobe = 0;
  int tuned_refine_factor = 0;
  int tuned_k = 0;
  double target_recall = 0;
  double tuned_recall = 0;
  // The sidecar's build id, and when the index is one shard of a set
  // (index_sharding.h) its number, the set's size (0: a whole index) and
  // the ids it holds, [shard_first_id, shard_end_id) (with an id table:
  // the rows of the whole index it holds).
  std::string build_id;
  int shard_id = 0;
  int shard_count = 0;
  int64_t shard_first_id = 0;
  int64_t shard_end_id = 0;
  // The raw-vectors file (vectors_file.h) used for exact re-ranking, when
  // one was loaded; vectors_error says why one was not (empty when there
  // was none or loading was not asked for).
  bool has_vectors = false;
  std::string vectors_path;
  std::string vectors_dtype;  // "f32" or "f16"
  int64_t vectors_file_bytes = 0;
  std::string vectors_error;
  // The id table (id_table.h) of an index built with its user's own ids
  // (the sidecar's id_table): loaded whenever the sidecar asks for it,
  // since without it answers would be row numbers.
  bool has_id_table = false;
  std::string id_table_path;
  int64_t id_table_file_bytes = 0;
  // The payloads (payload_file.h) of an index built with them (the
  // sidecar's payloads): loaded whenever the sidecar asks for them.
  bool has_payloads = false;
  std::string payloads_path;
  int64_t payloads_file_bytes = 0;
  std::vector<std::string> payload_fields;
  int64_t max_payload_json_bytes = 0;  // the largest row's, all fields
  // The attribute store (attribute_store.h) of an index built with
  // attributes (the sidecar's `attributes`): loaded whenever the sidecar
  // asks for it.
  bool has_attributes = false;
  std::string attributes_path;
  int64_t attributes_file_bytes = 0;
  // The most bytes the filter cache (filter_cache.h) may hold: counted in
  // heap_bytes, as the index's own heap is; 0 without attributes or with
  // the cache off (LoadOptions::filter_cache_bytes).
  int64_t filter_cache_bytes = 0;
  // The text index (text/text_index.h) of an index built with one (the
  // sidecar's text_field, the payload field it was built from): loaded
  // whenever the sidecar names one.
  std::string text_field;  // empty: none
  std::string text_path;
  int64_t text_file_bytes = 0;
};

// What Load() does with the raw-vectors file VectorsPath(path).
enum class VectorsPolicy {
  kIgnore,    // never opened: no re-ranking
  kOptional,  // loaded when present and valid; missing or invalid: the index
              // alone serves (the reason is in IndexInfo::vectors_error)
  kRequired,  // missing or invalid: Load() fails with the reason
};

struct LoadOptions {
  // Version number the snapshot reports (set by the caller that owns the
  // versioning scheme).
  int64_t version = 1;
  // Build the precomputed table (IVF-PQ: nlist * M * 256 * 4 heap bytes;
  // FastScan with L2 residuals: nlist * M * 16 * 4).
  bool use_precomputed_table = true;
  // Read the file once in a probe process first (the program's own
  // executable, started afresh; see index_probe.h): a corrupt file
  // that would crash FAISS's reader then yields an error instead of killing
  // the caller.
  bool probe_in_subprocess = true;
  // How long the probe may take to answer (reading the file's structure and
  // one search); then it is killed and the load fails with
  // DEADLINE_EXCEEDED instead of waiting for ever on a filesystem that hangs.
  absl::Duration probe_timeout = absl::Minutes(5);
  // When the file has a metadata sidecar, read the whole file once to check
  // its CRC-32 against the sidecar's (one sequential read of the file), so
  // that a file changed after it was built is refused instead of served.
  // Also checks the payload CRC-32 of the vectors file and of the id
  // table and the attribute store against their headers.
  // Without it, IndexSnapshot::VerifyChecksums() does the same later.
  bool verify_checksum = true;
  VectorsPolicy vectors = VectorsPolicy::kOptional;
  // Bound of the snapshot's cache of compiled attribute filters
  // (filter_cache.h; knnd's config filter_cache_bytes, whose default this
  // is), for an index with attributes; 0: no cache.
  int64_t filter_cache_bytes = int64_t{16} << 20;
  // Called before the heap-heavy part of loading: the file has been read
  // with its inverted lists mapped and without the precomputed table, and
  // `planned` says the heap the loaded index will need (heap_bytes and
  // precomputed_table_bytes include the table about to be built;
  // read_peak_extra_bytes what reading held briefly beyond it). A non-OK
  // status is returned by Load() and nothing more is allocated.
  std::function<absl::Status(const IndexInfo& planned)> check_heap;
};

class IndexSnapshot {
 public:
  // Reads `path` with the inverted lists memory-mapped, checks that it is an
  // IVF-PQ index or a knnd FastScan file (optionally behind a pre-transform
  // such as OPQ) whose every inverted list lies inside the file, and turns
  // list prefetch threads off.
  // A metadata sidecar (MetadataPath(path)), when present, must match the
  // file: checksum, dim, ntotal and metric; when it says id_table, the id
  // table IdTablePath(path) must load with ntotal rows; when it says
  // attributes, the store AttributeStorePath(path) likewise.
  // A missing, truncated, corrupt or unsupported file is an error whose
  // message says what is wrong; never a crash.
  static absl::StatusOr<std::unique_ptr<IndexSnapshot>> Load(
      const std::string& path, const LoadOptions& options);

  ~IndexSnapshot();
  IndexSnapshot(const IndexSnapshot&) = delete;
  IndexSnapshot& operator=(const IndexSnapshot&) = delete;

  const IndexInfo& info() const { return info_; }

  // The id answers carry for the index's `row`-th vector (0 <= row <
  // ntotal, the order it was built in): the id table's, else the row (plus
  // a shard's first id).
  int64_t IdOfRow(int64_t row) const { return list_ids_.IdOfRow(row); }

  // The row holding the answer id `id`, or -1 when this index holds none
  // (get_records.h looks records up by it).
  int64_t RowOfId(int64_t id) const { return list_ids_.RowOfId(id); }

  // The raw-vectors file; null for a version served without one.
  const VectorsFile* vectors() const { return vectors_.get(); }

  // The attribute store; null for an index without attributes.
  const AttributeStore* attributes() const { return attributes_.get(); }

  // The text index; null for an index without one.
  const TextIndex* text() const { return text_.get(); }

  // The cache of this version's compiled filters (search_request.cc's
  // ParseFilter keeps them); null without attributes or with the cache off.
  FilterCache* filter_cache() const { return filter_cache_.get(); }

  // The rows `filter` admits (attribute_filter.h) and, when `allowed_ids`
  // (ascending ids as answers carry them) is not empty, that list holds:
  // what SearchArgs::allowed_rows takes. INVALID_ARGUMENT as
  // CompileFilter() says.
  absl::StatusOr<RowBitmap> CompileFilter(
      const knnd::v1::Filter& filter, absl::Span<const int64_t> allowed_ids,
      const FilterLimits& limits) const;

  // `filter` as SearchArgs::allowed_range when it is one eq or range
  // condition on a numeric attribute (attribute_filter.h
  // CompileColumnRange), else nullopt: compile it with CompileFilter().
  // The range borrows this snapshot's attribute store.
  absl::StatusOr<std::optional<ColumnRange>> CompileColumnRange(
      const knnd::v1::Filter& filter, const FilterLimits& limits) const;

  // The lists of this index cut down to `rows` (a compiled filter
  // admitting `matched` rows), for the filter cache to keep with it and
  // searches to pass as SearchArgs::allowed_lists: null where they would
  // not pay, i.e. the filter admits more than one row in
  // kFilteredListsRatio (its scan would read most of each block anyway),
  // they could take more than half the cache, or the index's scan cannot
  // use them (a FAISS IVF-PQ file).
  static constexpr int64_t kFilteredListsRatio = 4;
  std::unique_ptr<const FilteredLists> FilterLists(const RowBitmap& rows,
                                                   int64_t matched) const;
  // Whether FilterLists() builds lists for a filter of `matched` rows.
  bool KeepsFilterLists(int64_t matched) const;

  // k-NN search; with metric cosine the queries are L2-normalised first
  // (on a copy). With an id table, allowed_ids are translated to rows
  // before the search and the answers (candidates too) back to ids after
  // it, equal distances ordered by id. With `filter` (an attribute filter
  // prepared for this snapshot and these arguments, prepared_filter.h),
  // the plan it holds, run without planning again (filtered_search.h); the
  // filter's rows reach ServingIndex as SearchArgs' allowed_* fields, which
  // `args` itself leaves unset. Results of each query are sorted closest
  // first; missing neighbours are id -1 with distance +inf (L2) or -inf
  // (inner product). With refine_factor > 0 the distances are exact
  // (squared L2, inner product or cosine), computed from the memory-mapped
  // raw vectors. Arguments are assumed validated (see search_request.h); a
  // FAISS error is returned as INTERNAL, refine_factor > 0 without vectors
  // as FAILED_PRECONDITION, allowed_rows or allowed_range set in `args` as
  // INVALID_ARGUMENT (a filter comes prepared).
  absl::Status Search(const SearchArgs& args,
                      const PreparedFilter* filter = nullptr) const;

  // The payload fields a request asks for (every field, or `fields`):
  // FAILED_PRECONDITION naming the index when it has no payloads,
  // INVALID_ARGUMENT naming an unknown field and the index's fields.
  absl::StatusOr<PayloadSelection> SelectPayloads(
      bool all_fields, absl::Span<const std::string> fields) const;
  // The bytes AppendPayload() appends for the answer id `id`.
  int64_t PayloadJsonBytes(int64_t id, const PayloadSelection& selection) const;
  // Appends the selected fields of the payload of the answer id `id` as a
  // compact JSON object; nothing for -1 or an id this index does not hold.
  // Requires payloads (SelectPayloads() succeeded).
  void AppendPayload(int64_t id, const PayloadSelection& selection,
                     std::string* out) const;

  // The checks Load() skips without verify_checksum: the index file's size
  // and CRC-32 against its sidecar (when it has one) and the payload CRC-32
  // of the vectors file, the id table, the payload file and the attribute
  // store against their headers (when loaded); each reads its whole file
  // once. DATA_LOSS naming the file and both values on a
  // mismatch; CANCELLED when `cancel` turned true during a read. Safe to
  // call while searches run.
  absl::Status VerifyChecksums(const std::atomic<bool>* cancel = nullptr) const;

 private:
  IndexSnapshot(std::unique_ptr<ServingIndex> faiss, IndexInfo info,
                std::unique_ptr<VectorsFile> vectors,
                std::unique_ptr<IdTable> id_table,
                std::unique_ptr<PayloadFile> payloads,
                std::unique_ptr<AttributeStore> attributes,
                std::unique_ptr<TextIndex> text);

  // ServingIndex::Search of `call`; with `filter` and the IVF plan, the
  // widening of filtered_search.h, each query needing `candidates` results
  // (or every matching row when fewer match) and widened until the lists
  // probed reach past its k-th. With a filter, `deep` (num_queries
  // entries) says which queries re-rank every candidate (filter_planner.h:
  // those of the flat plan, and the IVF plan's whose matches lay far out).
  absl::Status SearchIndex(const SearchArgs& call, const PreparedFilter* filter,
                           int candidates, int k,
                           std::vector<char>* deep = nullptr) const;

  std::unique_ptr<ServingIndex> faiss_;
  IndexInfo info_;
  std::unique_ptr<VectorsFile> vectors_;  // null without re-ranking
  std::unique_ptr<IdTable> id_table_;     // null: list ids are the ids
  std::unique_ptr<AttributeStore> attributes_;  // null: no attributes
  ListIds list_ids_;                      // borrows id_table_
  std::unique_ptr<PayloadFile> payloads_;  // null: no payloads
  std::unique_ptr<TextIndex> text_;        // null: no text index
  std::unique_ptr<FilterCache> filter_cache_;  // null: none
};

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_SNAPSHOT_H_
