#include "knnd/index/index_snapshot.h"

#include <malloc.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/filtered_search.h"
#include "knnd/index/index_probe.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/index/rerank.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/version_manifest.h"

namespace knnd {
namespace {

using knnd::v1::VersionManifest;

// The manifest of the version at `path` (null: a bare FAISS file, with
// nothing beside it), checked against the index file's size and the
// sidecar; FAILED_PRECONDITION naming the files when the index has
// companions but no manifest binds them (a build or update killed before
// it committed, or files put beside it by hand).
absl::StatusOr<std::unique_ptr<VersionManifest>> ReadBoundVersion(
    const std::string& path) {
  absl::StatusOr<VersionManifest> manifest = ReadVersionManifest(path);
  if (absl::IsNotFound(manifest.status())) {
    const std::vector<std::string> present = VersionFilesPresent(path);
    if (present.empty()) return nullptr;
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has ", absl::StrJoin(present, ", "),
        " beside it but no manifest ", ManifestPath(path),
        " binding them into one version: a build or update that did not "
        "finish (run it again), or files of a knnctl older than manifests "
        "(rebuild, or `knnctl seal` once you know they belong together)"));
  }
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckIndexAndSidecar(path, *manifest); !s.ok()) {
    return s;
  }
  return std::make_unique<VersionManifest>(*std::move(manifest));
}

// Applies `meta`, the metadata sidecar of `path` as read (NOT_FOUND: it
// has none), to `info`: the sidecar must describe this file (checksum,
// dim, ntotal, FAISS metric).
absl::Status ApplyMetadata(
    const std::string& path,
    const absl::StatusOr<knnd::v1::IndexMetadata>& meta, bool verify_checksum,
    IndexInfo& info) {
  const std::string sidecar = MetadataPath(path);
  if (absl::IsNotFound(meta.status())) return absl::OkStatus();
  if (!meta.ok()) return meta.status();
  if (verify_checksum) {
    if (absl::Status s = VerifyIndexChecksum(path, *meta); !s.ok()) return s;
  }
  absl::StatusOr<Metric> metric = ParseMetric(meta->metric());
  if (!metric.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(sidecar, ": ", metric.status().message()));
  }
  const Metric file_metric =
      *metric == Metric::kCosine ? Metric::kInnerProduct : *metric;
  if (meta->dim() != static_cast<uint32_t>(info.dim) ||
      meta->ntotal() != info.ntotal || file_metric != info.metric ||
      (*metric == Metric::kCosine && !meta->normalized())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s (dim=%d ntotal=%d metric=%s normalized=%s) does not describe "
        "index file %s (dim=%d ntotal=%d metric=%s)",
        sidecar, meta->dim(), meta->ntotal(), meta->metric(),
        meta->normalized() ? "true" : "false", path, info.dim, info.ntotal,
        MetricName(info.metric)));
  }
  info.metric = *metric;
  info.has_metadata = true;
  info.sidecar_crc32 = meta->crc32();
  info.sidecar_file_bytes = meta->file_bytes();
  info.normalized = meta->normalized();
  info.factory = meta->factory();
  info.source = meta->source();
  info.created = meta->created();
  info.tuned_nprobe = static_cast<int>(meta->tuned_nprobe());
  info.tuned_refine_factor = static_cast<int>(meta->tuned_refine_factor());
  info.tuned_k = static_cast<int>(meta->tuned_k());
  info.target_recall = meta->target_recall();
  info.tuned_recall = meta->tuned_recall();
  info.build_id = meta->build_id();
  info.has_id_table = meta->id_table();
  info.has_payloads = meta->payloads();
  info.has_attributes = meta->attributes();
  info.text_field = meta->text_field();
  if (meta->shard_count() > 0) {
    if (meta->shard_id() >= meta->shard_count() ||
        meta->shard_first_id() < 0 ||
        meta->shard_end_id() <= meta->shard_first_id()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: shard %d of %d holding ids [%d, %d) is not a valid shard",
          sidecar, meta->shard_id(), meta->shard_count(),
          meta->shard_first_id(), meta->shard_end_id()));
    }
    info.shard_id = static_cast<int>(meta->shard_id());
    info.shard_count = static_cast<int>(meta->shard_count());
    info.shard_first_id = meta->shard_first_id();
    info.shard_end_id = meta->shard_end_id();
  }
  return absl::OkStatus();
}

// Opens VectorsPath(path) as `options.vectors` asks; a file refused under
// kOptional leaves the reason in info.vectors_error and returns null.
absl::StatusOr<std::unique_ptr<VectorsFile>> OpenVectors(
    const std::string& path, const LoadOptions& options,
    const VersionManifest* manifest, IndexInfo& info) {
  if (options.vectors == VectorsPolicy::kIgnore) return nullptr;
  // Only a vectors file the manifest binds is this version's; one beside
  // an index without a manifest refused the load already.
  absl::StatusOr<std::unique_ptr<VectorsFile>> vectors =
      manifest != nullptr && BoundFile(*manifest, kRoleVectors) != nullptr
          ? VectorsFile::Open(VectorsPath(path), info.dim, info.ntotal,
                              options.verify_checksum)
          : absl::NotFoundError(absl::StrCat("no raw-vectors file is bound to ",
                                             path, " (", VectorsPath(path),
                                             ")"));
  if (vectors.ok()) {
    // A bound file replaced by another build's would re-rank with other
    // rows' vectors: never used, refused or served without re-ranking as
    // the policy says for any unusable vectors file.
    if (absl::Status bound = CheckBoundCompanion(path, *manifest, kRoleVectors,
                                                 (*vectors)->file_bytes(),
                                                 (*vectors)->content_crc32());
        !bound.ok()) {
      vectors = bound;
    }
  }
  if (vectors.ok() && info.shard_count > 0 &&
      info.shard_end_id - info.shard_first_id != info.ntotal) {
    vectors = absl::InvalidArgumentError(absl::StrCat(
        "shard ", info.shard_id, " of ", info.shard_count, " holds ",
        info.ntotal, " vectors with ids in [", info.shard_first_id, ", ",
        info.shard_end_id,
        "), not one per id, so its vectors file cannot be read by id"));
  }
  if (!vectors.ok()) {
    if (options.vectors == VectorsPolicy::kRequired) {
      return absl::Status(
          vectors.status().code(),
          absl::StrCat(vectors.status().message(),
                       " (re-ranking vectors are required: "
                       "require_vectors=true)"));
    }
    if (!absl::IsNotFound(vectors.status())) {
      info.vectors_error = std::string(vectors.status().message());
    }
    return nullptr;
  }
  info.has_vectors = true;
  info.vectors_path = (*vectors)->path();
  info.vectors_dtype = VectorsDtypeName((*vectors)->dtype());
  info.vectors_file_bytes = (*vectors)->file_bytes();
  return vectors;
}

// A companion file of the version the sidecar declares, `opened` by its
// own Open(): an error carries what the sidecar says (`declared`), and the
// file must be the one the manifest binds for `role`.
template <typename T>
absl::StatusOr<std::unique_ptr<T>> BoundCompanion(
    absl::StatusOr<std::unique_ptr<T>> opened, const std::string& path,
    const VersionManifest& manifest, absl::string_view role,
    absl::string_view declared) {
  if (!opened.ok()) {
    return absl::Status(
        opened.status().code(),
        absl::StrCat(opened.status().message(), " (", MetadataPath(path),
                     " says ", declared, ")"));
  }
  if (absl::Status s =
          CheckBoundCompanion(path, manifest, role, (*opened)->file_bytes(),
                              (*opened)->content_crc32());
      !s.ok()) {
    return s;
  }
  return opened;
}

// Opens IdTablePath(path) when the sidecar asked for one (info.has_id_table)
// and fills in its path and size; null without one.
absl::StatusOr<std::unique_ptr<IdTable>> OpenIdTable(
    const std::string& path, bool verify_checksum,
    const VersionManifest& manifest, IndexInfo& info) {
  if (!info.has_id_table) return nullptr;
  absl::StatusOr<std::unique_ptr<IdTable>> table = BoundCompanion(
      IdTable::Open(IdTablePath(path), info.ntotal, verify_checksum), path,
      manifest, kRoleIds,
      "the index holds rows of its own ids, which only the id table "
      "translates");
  if (!table.ok()) return table;
  info.id_table_path = (*table)->path();
  info.id_table_file_bytes = (*table)->file_bytes();
  return table;
}

// Opens PayloadPath(path) when the sidecar asked for it (info.has_payloads)
// and fills in its path, size and fields; null without one.
absl::StatusOr<std::unique_ptr<PayloadFile>> OpenPayloads(
    const std::string& path, bool verify_checksum,
    const VersionManifest& manifest, IndexInfo& info) {
  if (!info.has_payloads) return nullptr;
  absl::StatusOr<std::unique_ptr<PayloadFile>> payloads = BoundCompanion(
      PayloadFile::Open(PayloadPath(path), info.ntotal, verify_checksum), path,
      manifest, kRolePayloads, "the index has payloads");
  if (!payloads.ok()) return payloads;
  info.payloads_path = (*payloads)->path();
  info.payloads_file_bytes = (*payloads)->file_bytes();
  info.payload_fields = (*payloads)->field_names();
  info.max_payload_json_bytes = (*payloads)->max_row_json_bytes();
  return payloads;
}

// Opens AttributeStorePath(path) when the sidecar asked for one
// (info.has_attributes) and fills in its path and size; null without one.
absl::StatusOr<std::unique_ptr<AttributeStore>> OpenAttributes(
    const std::string& path, bool verify_checksum,
    const VersionManifest& manifest, IndexInfo& info) {
  if (!info.has_attributes) return nullptr;
  absl::StatusOr<std::unique_ptr<AttributeStore>> store = BoundCompanion(
      AttributeStore::Open(AttributeStorePath(path), info.ntotal,
                           verify_checksum),
      path, manifest, kRoleAttributes, "the index was built with attributes");
  if (!store.ok()) return store;
  info.attributes_path = (*store)->path();
  info.attributes_file_bytes = (*store)->file_bytes();
  return store;
}

// Opens TextIndexPath(path) when the sidecar names a text field
// (info.text_field) and fills in its path and size; null without one.
absl::StatusOr<std::unique_ptr<TextIndex>> OpenText(
    const std::string& path, bool verify_checksum,
    const VersionManifest& manifest, IndexInfo& info) {
  if (info.text_field.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<TextIndex>> text = BoundCompanion(
      TextIndex::Open(TextIndexPath(path), info.ntotal, verify_checksum), path,
      manifest, kRoleText,
      absl::StrCat("the index has a text index of field \"", info.text_field,
                   "\""));
  if (!text.ok()) return text;
  info.text_path = (*text)->path();
  info.text_file_bytes = (*text)->file_bytes();
  return text;
}

}  // namespace

IndexSnapshot::IndexSnapshot(std::unique_ptr<ServingIndex> faiss,
                             IndexInfo info,
                             std::unique_ptr<VectorsFile> vectors,
                             std::unique_ptr<IdTable> id_table,
                             std::unique_ptr<PayloadFile> payloads,
                             std::unique_ptr<AttributeStore> attributes,
                             std::unique_ptr<TextIndex> text)
    : faiss_(std::move(faiss)),
      info_(std::move(info)),
      vectors_(std::move(vectors)),
      id_table_(std::move(id_table)),
      attributes_(std::move(attributes)),
      list_ids_(info_.shard_first_id, info_.ntotal, id_table_.get()),
      payloads_(std::move(payloads)),
      text_(std::move(text)),
      filter_cache_(
          info_.filter_cache_bytes > 0
              ? std::make_unique<FilterCache>(info_.filter_cache_bytes)
              : nullptr) {}

IndexSnapshot::~IndexSnapshot() {
  faiss_.reset();
  // A version's heap (centroids, codebooks, the precomputed table: up to
  // gigabytes) is freed in a few large blocks that glibc may keep in its
  // arenas rather than return; give them back so that anonymous memory
  // falls to its level before the swap (issue: no growth across versions).
  malloc_trim(0);
}

absl::StatusOr<std::unique_ptr<IndexSnapshot>> IndexSnapshot::Load(
    const std::string& path, const LoadOptions& options) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<VersionManifest>> manifest =
      ReadBoundVersion(path);
  if (!manifest.ok()) return manifest.status();
  static const VersionManifest* const kNoFiles = new VersionManifest();
  const VersionManifest& bound = *manifest != nullptr ? **manifest : *kNoFiles;
  if (options.probe_in_subprocess) {
    if (absl::Status s = ProbeIndexInSubprocess(path, options.probe_timeout);
        !s.ok()) {
      return s;
    }
  }
  // Read without the precomputed table first (the lists are mapped, so this
  // allocates only centroids and codebooks), check the planned heap, then
  // build the table, the part that can be large.
  absl::StatusOr<std::unique_ptr<ServingIndex>> faiss =
      ServingIndex::Open(path);
  if (!faiss.ok()) return faiss.status();
  const int64_t table_bytes =
      options.use_precomputed_table ? (*faiss)->PlannedTableBytes() : 0;
  // The sidecar, read once: whether the index has attributes is needed by
  // the heap check (their filter cache counts), the rest after it; a
  // missing or unreadable sidecar is ApplyMetadata()'s to report.
  const absl::StatusOr<knnd::v1::IndexMetadata> meta =
      ReadIndexMetadata(MetadataPath(path));
  const int64_t cache_bytes =
      meta.ok() && meta->attributes()
          ? std::max<int64_t>(options.filter_cache_bytes, 0)
          : 0;
  if (options.check_heap) {
    IndexInfo planned;
    static_cast<IndexFacts&>(planned) = (*faiss)->facts();
    planned.precomputed_table_bytes = table_bytes;
    planned.filter_cache_bytes = cache_bytes;
    planned.heap_bytes += table_bytes + cache_bytes;
    if (absl::Status s = options.check_heap(planned); !s.ok()) return s;
  }
  if (table_bytes > 0) {
    if (absl::Status s = (*faiss)->BuildPrecomputedTable(); !s.ok()) return s;
  }
  IndexInfo info;
  static_cast<IndexFacts&>(info) = (*faiss)->facts();
  if (absl::Status s =
          ApplyMetadata(path, meta, options.verify_checksum, info);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<IdTable>> id_table =
      OpenIdTable(path, options.verify_checksum, bound, info);
  if (!id_table.ok()) return id_table.status();
  absl::StatusOr<std::unique_ptr<PayloadFile>> payloads =
      OpenPayloads(path, options.verify_checksum, bound, info);
  if (!payloads.ok()) return payloads.status();
  absl::StatusOr<std::unique_ptr<AttributeStore>> attributes =
      OpenAttributes(path, options.verify_checksum, bound, info);
  if (!attributes.ok()) return attributes.status();
  absl::StatusOr<std::unique_ptr<TextIndex>> text =
      OpenText(path, options.verify_checksum, bound, info);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::unique_ptr<VectorsFile>> vectors =
      OpenVectors(path, options, manifest->get(), info);
  if (!vectors.ok()) return vectors.status();
  if (info.has_attributes) {
    info.filter_cache_bytes = cache_bytes;
    info.heap_bytes += cache_bytes;
  }
  info.version = options.version;
  info.load_time = absl::Now();
  info.load_duration = info.load_time - start;
  return std::unique_ptr<IndexSnapshot>(
      new IndexSnapshot(std::move(*faiss), std::move(info), std::move(*vectors),
                        std::move(*id_table), std::move(*payloads),
                        std::move(*attributes), std::move(*text)));
}

absl::Status IndexSnapshot::VerifyChecksums(
    const std::atomic<bool>* cancel) const {
  if (info_.has_metadata) {
    knnd::v1::IndexMetadata recorded;
    recorded.set_file_bytes(info_.sidecar_file_bytes);
    recorded.set_crc32(info_.sidecar_crc32);
    if (absl::Status s = VerifyIndexChecksum(info_.path, recorded, cancel);
        !s.ok()) {
      return s;
    }
  }
  if (id_table_ != nullptr) {
    if (absl::Status s = id_table_->VerifyChecksum(cancel); !s.ok()) return s;
  }
  if (payloads_ != nullptr) {
    if (absl::Status s = payloads_->VerifyChecksum(cancel); !s.ok()) return s;
  }
  if (attributes_ != nullptr) {
    if (absl::Status s = attributes_->VerifyChecksum(cancel); !s.ok()) {
      return s;
    }
  }
  if (text_ != nullptr) {
    if (absl::Status s = text_->VerifyChecksum(cancel); !s.ok()) return s;
  }
  if (vectors_ != nullptr) return vectors_->VerifyChecksum(cancel);
  return absl::OkStatus();
}

absl::StatusOr<PayloadSelection> IndexSnapshot::SelectPayloads(
    bool all_fields, absl::Span<const std::string> fields) const {
  if (payloads_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index ", info_.path, " (version ", info_.version,
        ") has no payloads; build it with knnctl build --payloads FILE"));
  }
  return payloads_->Select(all_fields, fields);
}

int64_t IndexSnapshot::PayloadJsonBytes(
    int64_t id, const PayloadSelection& selection) const {
  const int64_t row = list_ids_.RowOfId(id);
  return row < 0 ? 0 : payloads_->JsonBytes(row, selection);
}

void IndexSnapshot::AppendPayload(int64_t id,
                                  const PayloadSelection& selection,
                                  std::string* out) const {
  const int64_t row = list_ids_.RowOfId(id);
  if (row >= 0) payloads_->AppendJson(row, selection, out);
}

absl::StatusOr<RowBitmap> IndexSnapshot::CompileFilter(
    const knnd::v1::Filter& filter, absl::Span<const int64_t> allowed_ids,
    const FilterLimits& limits) const {
  absl::StatusOr<RowBitmap> rows =
      knnd::CompileFilter(filter, attributes_.get(), limits);
  if (!rows.ok() || allowed_ids.empty()) return rows;
  RowBitmap allowed(info_.ntotal);
  for (int64_t list_id : list_ids_.ListIdsOf(allowed_ids)) {
    const int64_t row = list_ids_.RowOf(list_id);
    if (row >= 0) allowed.Set(row);
  }
  rows->And(allowed);
  return rows;
}

absl::StatusOr<std::optional<ColumnRange>> IndexSnapshot::CompileColumnRange(
    const knnd::v1::Filter& filter, const FilterLimits& limits) const {
  return knnd::CompileColumnRange(filter, attributes_.get(), limits);
}

bool IndexSnapshot::KeepsFilterLists(int64_t matched) const {
  return filter_cache_ != nullptr && info_.fastscan &&
         matched * kFilteredListsRatio <= info_.ntotal &&
         FilteredLists::Bytes(info_.nlist,
                              static_cast<size_t>(2 * info_.code_size_bytes),
                              matched) <= filter_cache_->max_bytes() / 2;
}

std::unique_ptr<const FilteredLists> IndexSnapshot::FilterLists(
    const RowBitmap& rows, int64_t matched) const {
  if (!KeepsFilterLists(matched)) return nullptr;
  return faiss_->FilterLists(rows, info_.shard_first_id);
}

absl::Status IndexSnapshot::SearchIndex(const SearchArgs& call,
                                        const PreparedFilter* filter,
                                        int candidates, int k,
                                        std::vector<char>* deep) const {
  // Unfiltered, or the flat plan: every match is seen in one call.
  if (filter == nullptr || filter->plan == FilterPlan::kFlat) {
    if (deep != nullptr) deep->assign(static_cast<size_t>(call.num_queries), 1);
    return faiss_->Search(call);
  }
  IvfWidening plan;
  plan.start_nprobe = filter->start_nprobe;
  plan.need = std::min<int64_t>(candidates, filter->matched_rows);
  plan.k = k;
  plan.matched_rows = filter->matched_rows;
  return SearchIvfWidening(*faiss_, call, plan, deep);
}

absl::Status IndexSnapshot::Search(const SearchArgs& args,
                                   const PreparedFilter* filter) const {
  if (args.rerank_time != nullptr) *args.rerank_time = absl::ZeroDuration();
  if (FiltersRows(args)) {
    return absl::InvalidArgumentError(
        "search of a snapshot with allowed_rows or allowed_range set: an "
        "attribute filter comes prepared (PrepareFilter)");
  }
  if (args.refine_factor > 0 && vectors_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refine_factor=", args.refine_factor, " needs the raw-vectors file ",
        VectorsPath(info_.path), ", which is not loaded",
        info_.vectors_error.empty() ? ""
                                    : absl::StrCat(": ", info_.vectors_error)));
  }
  // What the index itself searches: the request's queries (normalised for
  // cosine) and its allow-list in list ids and, with re-ranking, its
  // candidates into buffers of our own.
  SearchArgs call = args;
  std::vector<int64_t> allowed_list_ids;
  if (list_ids_.has_table() && !args.allowed_ids.empty()) {
    allowed_list_ids = list_ids_.ListIdsOf(args.allowed_ids);
    call.allowed_ids = allowed_list_ids;
  }
  std::vector<float> normalized;
  if (info_.metric == Metric::kCosine) {
    // The indexed vectors were normalised at build time, so inner products
    // are cosines only if the queries are normalised too. A copy: the
    // caller's buffer is the request message's.
    normalized.assign(args.queries,
                      args.queries + args.num_queries * info_.dim);
    NormalizeRows(normalized.data(), args.num_queries, info_.dim);
    call.queries = normalized.data();
  }
  if (filter != nullptr) {
    // The prepared filter's rows, as ServingIndex takes them.
    call.allowed_rows = filter->rows.get();
    call.allowed_rows_count =
        filter->rows != nullptr ? filter->matched_rows : -1;
    call.allowed_range = filter->range.has_value() ? &*filter->range : nullptr;
    call.allowed_lists = filter->lists.get();
    call.allowed_rows_first = info_.shard_first_id;
    call.allowed_lists_flat = filter->plan == FilterPlan::kFlat;
    if (filter->matched_rows == 0) {
      // Nothing to search: an empty, padded answer.
      const int64_t n = args.num_queries * ResultWidth(args);
      std::fill_n(args.ids, n, int64_t{-1});
      std::fill_n(args.distances, n, MissingDistance(info_.metric));
      if (args.return_candidates && args.refine_factor > 0) {
        std::fill_n(args.approx_distances, n, MissingDistance(info_.metric));
      }
      return absl::OkStatus();
    }
    if (filter->plan == FilterPlan::kExact) {
      // Every matching row at its exact distance; with return_candidates
      // the best ResultWidth() of them, their estimates exact too.
      const absl::Time start = absl::Now();
      const int width = ResultWidth(args);
      SearchExactRows(
          *vectors_, list_ids_, info_.metric, call.queries, args.num_queries,
          filter->rows != nullptr ? filter->rows->Rows(info_.shard_first_id)
                                  : filter->range->Rows(info_.shard_first_id),
          width, args.distances, args.ids);
      if (args.return_candidates && args.refine_factor > 0) {
        std::copy_n(args.distances, args.num_queries * width,
                    args.approx_distances);
      }
      if (args.rerank_time != nullptr) *args.rerank_time = absl::Now() - start;
      return absl::OkStatus();
    }
  }
  if (args.refine_factor <= 0) {
    if (absl::Status s = SearchIndex(call, filter, args.k, args.k); !s.ok()) {
      return s;
    }
    list_ids_.ToAnswerIds(args.num_queries, args.k, args.distances, args.ids);
    return absl::OkStatus();
  }

  // The kc best estimates, ties by id (rerank.h), from FAISS's kf best
  // (memory_model.h counts these buffers).
  const int kc = args.k * args.refine_factor;
  const int kf = kc + CandidateSlack(kc);
  const size_t nf = static_cast<size_t>(args.num_queries) * kf;
  std::vector<float> fetched_distances(nf);
  std::vector<int64_t> fetched_ids(nf);
  call.k = kf;
  call.distances = fetched_distances.data();
  call.ids = fetched_ids.data();
  std::vector<char> deep;
  if (absl::Status s = SearchIndex(call, filter, kc, args.k, &deep); !s.ok()) {
    return s;
  }
  const absl::Time start = absl::Now();
  if (args.return_candidates) {
    // Every candidate with both distances, for a merger of shards.
    KeepBestCandidates(info_.metric, fetched_ids.data(),
                       fetched_distances.data(), args.num_queries, kf, kc,
                       args.ids, args.approx_distances, list_ids_);
    ExactCandidateDistances(*vectors_, list_ids_, info_.metric, call.queries,
                            args.num_queries, kc, args.ids, args.distances);
    const float pad = MissingDistance(info_.metric);
    for (int64_t i = 0; i < args.num_queries * kc; ++i) {
      if (args.ids[i] < 0) args.approx_distances[i] = pad;
    }
  } else if (filter == nullptr) {
    const size_t n = static_cast<size_t>(args.num_queries) * kc;
    std::vector<float> candidate_distances(n);
    std::vector<int64_t> candidate_ids(n);
    KeepBestCandidates(info_.metric, fetched_ids.data(),
                       fetched_distances.data(), args.num_queries, kf, kc,
                       candidate_ids.data(), candidate_distances.data(),
                       list_ids_);
    RerankExact(*vectors_, list_ids_, info_.metric, call.queries,
                args.num_queries, kc, candidate_ids.data(), args.k,
                args.distances, args.ids);
  } else {
    // Every fetched candidate in order, of which the kc best are
    // re-ranked, or all of them where the matches lie far out
    // (filter_planner.h).
    std::vector<float> candidate_distances(nf);
    std::vector<int64_t> candidate_ids(nf);
    KeepBestCandidates(info_.metric, fetched_ids.data(),
                       fetched_distances.data(), args.num_queries, kf, kf,
                       candidate_ids.data(), candidate_distances.data(),
                       list_ids_);
    const int64_t dim = info_.dim;
    for (int64_t q = 0; q < args.num_queries; ++q) {
      RerankExact(*vectors_, list_ids_, info_.metric, call.queries + q * dim, 1,
                  deep[q] != 0 ? kf : kc, candidate_ids.data() + q * kf, args.k,
                  args.distances + q * args.k, args.ids + q * args.k);
    }
  }
  if (args.rerank_time != nullptr) *args.rerank_time = absl::Now() - start;
  return absl::OkStatus();
}

}  // namespace knnd
