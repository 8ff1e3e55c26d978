#include "knnd/rpc/knn_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "knnd/base/saturating.h"
#include "knnd/index/memory_model.h"
#include "knnd/rpc/result_fields.h"
#include "knnd/rpc/search_payloads.h"
#include "knnd/serving/search_request.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

knnd::v1::Metric ToProto(Metric metric) {
  switch (metric) {
    case Metric::kL2: return knnd::v1::METRIC_L2;
    case Metric::kInnerProduct: return knnd::v1::METRIC_INNER_PRODUCT;
    case Metric::kCosine: return knnd::v1::METRIC_COSINE;
  }
  return knnd::v1::METRIC_UNSPECIFIED;
}

void SetShard(const IndexInfo& index, knnd::v1::ShardInfo* shard) {
  shard->set_shard_id(static_cast<uint32_t>(index.shard_id));
  shard->set_shard_count(static_cast<uint32_t>(index.shard_count));
  shard->set_build_id(index.build_id);
  shard->set_first_id(index.shard_first_id);
  shard->set_end_id(index.shard_end_id);
}

// ", retained: 3, 2" or "".
std::string RetainedNote(const std::vector<int64_t>& retained) {
  return retained.empty() ? ", none retained"
                          : absl::StrCat(", retained: ",
                                         absl::StrJoin(retained, ", "));
}

}  // namespace

KnnServiceImpl::KnnServiceImpl(const Options& options, IndexHolder* holder,
                               AdmissionGate* gate, Batcher* batcher,
                               Metrics* metrics, const TokenAuthenticator* auth,
                               CallHold* hold)
    : options_(options),
      holder_(holder),
      batcher_(batcher),
      metrics_(metrics),
      auth_(auth),
      admission_({options.retry_pushback_ms}, gate, metrics, auth, hold),
      search_(&service_, &Async::RequestSearch,
              [this](SearchCall* call) { Search(call); }),
      info_(&service_, &Async::RequestGetIndexInfo,
            [this](InfoCall* call) { GetIndexInfo(call); }),
      get_(&service_, &Async::RequestGet,
           [this](GetCall* call) { Get(call); }) {}

void KnnServiceImpl::Listen(const ServingQueue& queue) {
  search_.Listen(queue, queue.request_reads);
  info_.Listen(queue);
  get_.Listen(queue);
}

void KnnServiceImpl::Search(SearchCall* call) {
  const absl::Time arrival = absl::Now();
  const SearchAdmission::Answer answer = AnswerFor(call, arrival);
  if (!admission_.Authorize(*call, answer)) return;
  if (absl::Status s = CheckFilterParsed(call->request(),
                                         options_.limits.filter.max_depth);
      !s.ok()) {
    return admission_.Refuse(RejectReason::kInvalid, s, answer);
  }
  Pinned pinned;
  RejectReason reason = RejectReason::kInvalid;
  absl::StatusOr<ParsedSearch> parsed = PinAndParse(call, &pinned, &reason);
  if (!parsed.ok()) return admission_.Refuse(reason, parsed.status(), answer);
  if (parsed->filter.has_value() &&
      parsed->filter->cache_use != PreparedFilter::CacheUse::kNone) {
    const FilterCache::Stats cache = pinned.snapshot->filter_cache()->stats();
    metrics_->RecordFilterCache(
        parsed->filter->cache_use == PreparedFilter::CacheUse::kHit,
        cache.bytes, cache.entries);
  }
  absl::StatusOr<absl::optional<PayloadSelection>> payloads =
      RequestedPayloads(call->request(), *pinned.snapshot);
  if (!payloads.ok()) {
    return admission_.Refuse(RejectReason::kInvalid, payloads.status(),
                             answer);
  }
  // Payloads go with every result entry: candidates too for a merger.
  const int64_t payload_entries =
      !payloads->has_value()
          ? 0
          : SatMul(parsed->num_queries, AnswerWidth(call->request(), *parsed));
  const SearchShape shape =
      ShapeOf(*parsed, pinned.snapshot->info(), payload_entries);
  const int64_t bytes = EstimateSearchBytes(pinned.snapshot->info(), shape);
  if (Saturated(bytes)) {
    return admission_.RefuseSaturated(
        {parsed->num_queries, parsed->k, parsed->refine_factor,
         parsed->nprobe, payloads->has_value()},
        answer);
  }
  absl::StatusOr<AdmissionGate::Ticket> ticket = admission_.Admit(
      *call, arrival, call->deadline(),
      {parsed->num_queries, bytes,
       SatMul(parsed->num_queries, std::max(parsed->nprobe, 1))},
      answer);
  if (!ticket.ok()) return;
  batcher_->Submit(MakeJob(call, std::move(pinned), std::move(*parsed),
                           std::move(*payloads), shape, std::move(*ticket),
                           arrival));
}

SearchAdmission::Answer KnnServiceImpl::AnswerFor(SearchCall* call,
                                                  absl::Time arrival) const {
  return [call, arrival, metrics = metrics_](const absl::Status& status) {
    // The peer and status strings are built only when debug logging is on
    // (refusals under overload take this path hundreds of times a second).
    if (!status.ok() && spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("Search from {} failed: {}", call->peer(),
                    status.ToString());
    }
    metrics->RecordRpc(Metrics::Rpc::kSearch, call->protocol(), status.code(),
                       absl::Now() - arrival);
    call->Answer(status);
  };
}

absl::StatusOr<ParsedSearch> KnnServiceImpl::PinAndParse(
    SearchCall* call, Pinned* pinned, RejectReason* reason) const {
  const knnd::v1::SearchRequest& request = call->request();
  if (absl::Status s =
          PinVersion(call, request.index_version(), pinned, reason);
      !s.ok()) {
    return s;
  }
  const IndexInfo& index = pinned->snapshot->info();
  const SearchLimits limits = ResolveLimits(options_.limits, index);
  absl::StatusOr<ParsedSearch> parsed =
      ParseSearchRequest(request, index, limits);
  if (!parsed.ok()) return parsed;
  if (absl::Status s = ParseTexts(request, *pinned->snapshot, limits, *parsed);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseFilter(request, *pinned->snapshot, limits, *parsed);
      !s.ok()) {
    return s;
  }
  return parsed;
}

absl::Status KnnServiceImpl::PinVersion(ServerCallBase* call, int64_t wanted,
                                        Pinned* pinned,
                                        RejectReason* reason) const {
  *reason = RejectReason::kInvalid;
  // The version asked for (a merger of shards pins one), else the serving
  // one.
  if (wanted < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("index_version=", wanted, " must be >= 0"));
  }
  pinned->snapshot = wanted > 0
                         ? holder_->PinVersion(wanted, &pinned->serving_version)
                         : holder_->Pin();
  if (pinned->snapshot == nullptr) {
    if (wanted > 0 && pinned->serving_version > 0) {
      call->AddTrailer(kServingVersionMetadata,
                       std::to_string(pinned->serving_version));
      return absl::FailedPreconditionError(absl::StrCat(
          "index_version=", wanted, " is not loaded here: version ",
          pinned->serving_version, " serves",
          RetainedNote(holder_->RetainedVersions()),
          " (keep_previous_versions keeps replaced versions loaded)"));
    }
    *reason = RejectReason::kNotReady;
    return holder_->NotServingStatus();
  }
  if (wanted == 0) pinned->serving_version = pinned->snapshot->info().version;
  return absl::OkStatus();
}

SearchShape KnnServiceImpl::ShapeOf(const ParsedSearch& parsed,
                                    const IndexInfo& index,
                                    int64_t payload_entries) const {
  return SearchShape{
      parsed.num_queries,
      parsed.hybrid.has_value() ? parsed.hybrid->vector_window : parsed.k,
      parsed.nprobe,
      static_cast<int64_t>(parsed.allowed_ids.size()),
      parsed.refine_factor,
      options_.max_batch_rows,
      PayloadBytesBound(index, payload_entries,
                        options_.max_send_message_bytes),
      parsed.filter.has_value(),
      parsed.filter.has_value() ? parsed.filter->matched_rows : 0,
      parsed.filter.has_value() && parsed.filter->rows != nullptr &&
          !parsed.filter->cached,
      static_cast<int64_t>(parsed.aligned_copy.size() * sizeof(float)),
      parsed.hybrid.has_value() ? parsed.hybrid->text_window : 0};
}

std::unique_ptr<SearchJob> KnnServiceImpl::MakeJob(
    SearchCall* call, Pinned pinned, ParsedSearch parsed,
    absl::optional<PayloadSelection> payloads, const SearchShape& shape,
    AdmissionGate::Ticket ticket, absl::Time arrival) const {
  const IndexInfo& index = pinned.snapshot->info();
  // Before parsed's storage moves into the job.
  const bool return_candidates = AnswersWithCandidates(call->request(), parsed);
  auto job = std::make_unique<SearchJob>();
  job->query_storage = std::move(parsed.aligned_copy);
  job->allowed_ids_storage = std::move(parsed.allowed_ids);
  job->filter = std::move(parsed.filter);
  job->hybrid = std::move(parsed.hybrid);
  SearchArgs& args = job->args;
  args.queries = job->query_storage.empty() ? parsed.queries
                                            : job->query_storage.data();
  args.num_queries = parsed.num_queries;
  // A hybrid answer of windows for a merger is as wide as both windows.
  args.k = parsed.hybrid.has_value()
               ? static_cast<int>(AnswerWidth(call->request(), parsed))
               : parsed.k;
  args.nprobe = parsed.nprobe;
  args.refine_factor = parsed.refine_factor;
  args.return_candidates = return_candidates;
  args.allowed_ids = job->allowed_ids_storage;

  // The answer's header, and its result arrays, which the search fills in
  // place.
  knnd::v1::SearchResponse* const response = call->response();
  const int width = ResultWidth(args);
  const int results = static_cast<int>(args.num_queries * width);
  response->set_num_queries(static_cast<uint32_t>(args.num_queries));
  response->set_k(width);
  response->set_index_version(index.version);
  response->set_serving_version(pinned.serving_version);
  response->set_metric(ToProto(index.metric));
  response->set_nprobe(static_cast<uint32_t>(args.nprobe));
  response->set_refine_factor(static_cast<uint32_t>(args.refine_factor));
  if (index.shard_count > 0) SetShard(index, response->mutable_shard());
  if (job->filter.has_value()) {
    response->set_filter_matched_rows(
        static_cast<uint64_t>(job->filter->matched_rows));
    switch (job->filter->plan) {
      case FilterPlan::kExact:
        response->set_filter_plan(knnd::v1::FILTER_PLAN_EXACT);
        break;
      case FilterPlan::kIvf:
        response->set_filter_plan(knnd::v1::FILTER_PLAN_IVF);
        break;
      case FilterPlan::kFlat:
        response->set_filter_plan(knnd::v1::FILTER_PLAN_FLAT);
        break;
    }
  }
  const ResultBuffers out =
      ResizeResults(results, args.return_candidates,
                    call->request().results_as_bytes(), 0.0f, response);
  args.ids = out.ids;
  args.distances = out.distances;
  args.approx_distances = out.approx_distances;
  if (job->hybrid.has_value()) {
    const bool vectors = job->hybrid->fusion != Fusion::kNone;
    response->set_fusion(FusionMethodOf(job->hybrid->fusion));
    response->mutable_text_ranks()->Resize(results, 0);
    response->mutable_text_scores()->Resize(results, 0.0f);
    job->hybrid_out.text_ranks = response->mutable_text_ranks()->mutable_data();
    job->hybrid_out.text_scores =
        response->mutable_text_scores()->mutable_data();
    if (vectors) {
      response->mutable_vector_ranks()->Resize(results, 0);
      response->mutable_vector_scores()->Resize(results, 0.0f);
      job->hybrid_out.vector_ranks =
          response->mutable_vector_ranks()->mutable_data();
      job->hybrid_out.vector_scores =
          response->mutable_vector_scores()->mutable_data();
    }
  }

  job->snapshot = pinned.snapshot;
  job->deadline = call->deadline();
  job->is_cancelled = [call] { return call->cancelled(); };
  // An HTTP listener thread serves many connections, which would wait for
  // a search run on it (bench/RESULTS.md, "HTTP/JSON beside gRPC").
  job->may_run_inline = call->protocol() != Metrics::Protocol::kHttp;
  job->ticket = std::move(ticket);
  job->on_done = [call, arrival, shape, slow = options_.slow_request,
                  metrics = metrics_, snapshot = std::move(pinned.snapshot),
                  payloads = std::move(payloads),
                  max_send = options_.max_send_message_bytes](
                     absl::Status status, const JobTimes& times) {
    // After the search: the payloads of the answer's ids, from the version
    // that answered.
    if (status.ok() && payloads.has_value()) {
      absl::StatusOr<int64_t> bytes =
          AddPayloads(*snapshot, *payloads, max_send, call->response());
      if (bytes.ok()) {
        metrics->RecordPayloadBytes(*bytes);
      } else {
        status = bytes.status();
      }
    }
    const absl::Duration total = absl::Now() - arrival;
    metrics->RecordSearchWork(shape.num_queries, times.queue, times.search);
    metrics->RecordRpc(Metrics::Rpc::kSearch, call->protocol(), status.code(),
                       total);
    if (!status.ok()) {
      if (spdlog::should_log(spdlog::level::debug)) {
        spdlog::debug("Search from {} failed after {}: {}", call->peer(),
                      absl::FormatDuration(total), status.ToString());
      }
    } else if (slow > absl::ZeroDuration() && total > slow) {
      spdlog::warn(
          "slow Search from {}: {} (queue {}, search {} in {} units), "
          "{} queries k={} nprobe={} refine_factor={} filter={}",
          call->peer(), absl::FormatDuration(total),
          absl::FormatDuration(times.queue), absl::FormatDuration(times.search),
          times.units, shape.num_queries, shape.k, shape.nprobe,
          shape.refine_factor, shape.filter_ids);
    }
    call->Answer(status);
  };
  return job;
}

void KnnServiceImpl::GetIndexInfo(InfoCall* call) {
  knnd::v1::GetIndexInfoResponse* const response = call->response();
  const absl::Time arrival = absl::Now();
  auto finish = [&](const absl::Status& status) {
    metrics_->RecordRpc(Metrics::Rpc::kGetIndexInfo, call->protocol(),
                        status.code(), absl::Now() - arrival);
    call->Answer(status);
  };
  if (absl::Status allowed =
          call->Authorize(*auth_, "/knnd.v1.KnnService/GetIndexInfo");
      !allowed.ok()) {
    finish(allowed);
    return;
  }
  std::shared_ptr<const IndexSnapshot> snapshot = holder_->Pin();
  if (snapshot == nullptr) {
    finish(holder_->NotServingStatus());
    return;
  }
  const IndexInfo& index = snapshot->info();
  const SearchLimits limits = ResolveLimits(options_.limits, index);
  response->set_dim(static_cast<uint32_t>(index.dim));
  response->set_metric(ToProto(index.metric));
  response->set_ntotal(index.ntotal);
  response->set_nlist(static_cast<uint32_t>(index.nlist));
  response->set_pq_m(static_cast<uint32_t>(index.pq_m));
  response->set_pq_nbits(static_cast<uint32_t>(index.pq_nbits));
  response->set_code_size_bytes(static_cast<uint32_t>(index.code_size_bytes));
  response->set_index_type(index.index_type);
  response->set_path(index.path);
  response->set_file_bytes(index.file_bytes);
  response->set_heap_bytes(index.heap_bytes);
  response->set_version(index.version);
  response->set_load_time_unix_seconds(absl::ToDoubleSeconds(
      index.load_time - absl::UnixEpoch()));
  response->set_load_duration_ms(
      absl::ToDoubleMilliseconds(index.load_duration));
  response->set_default_nprobe(static_cast<uint32_t>(limits.default_nprobe));
  response->set_max_nprobe(static_cast<uint32_t>(limits.max_nprobe));
  response->set_max_k(limits.max_k);
  response->set_max_queries_per_request(
      static_cast<uint32_t>(limits.max_queries_per_request));
  response->set_max_filter_ids(static_cast<uint32_t>(limits.max_filter_ids));
  response->set_max_receive_message_bytes(options_.max_receive_message_bytes);
  response->set_max_send_message_bytes(options_.max_send_message_bytes);
  response->set_has_metadata(index.has_metadata);
  response->set_normalized(index.normalized);
  response->set_factory(index.factory);
  response->set_source(index.source);
  response->set_created(index.created);
  response->set_has_vectors(index.has_vectors);
  response->set_has_id_table(index.has_id_table);
  response->set_has_payloads(index.has_payloads);
  for (const std::string& field : index.payload_fields) {
    response->add_payload_fields(field);
  }
  response->set_max_payload_bytes(index.max_payload_json_bytes);
  if (const AttributeStore* attributes = snapshot->attributes();
      attributes != nullptr) {
    for (const AttributeStore::Column& column : attributes->columns()) {
      knnd::v1::AttributeColumnInfo* out = response->add_attributes();
      out->set_name(column.name);
      out->set_type(AttributeTypeName(column.type));
      const bool numeric = IsNumeric(column.type);
      out->set_rows_with_value(numeric ? column.count
                                       : RowBitmap::CountWords(
                                             column.presence, column.rows));
      out->set_distinct_keywords(numeric ? 0 : column.count);
    }
  }
  response->set_max_filter_conditions(
      static_cast<uint32_t>(limits.filter.max_conditions));
  response->set_max_filter_depth(static_cast<uint32_t>(limits.filter.max_depth));
  response->set_max_text_bytes(static_cast<uint32_t>(limits.max_text_bytes));
  response->set_max_get_ids(static_cast<uint32_t>(limits.max_get_ids));
  if (const TextIndex* text = snapshot->text(); text != nullptr) {
    const TextIndexStats& stats = text->stats();
    knnd::v1::TextIndexInfo* out = response->mutable_text();
    out->set_field(stats.field);
    out->set_analyzer(text->analyzer().Describe());
    out->set_k1(stats.k1);
    out->set_b(stats.b);
    out->set_corpus_rows(stats.corpus_rows);
    out->set_average_length(stats.corpus_average_length);
    out->set_terms(stats.terms);
    out->set_postings(stats.postings);
    out->set_empty_rows(stats.empty_rows);
    out->set_file_bytes(text->file_bytes());
  }
  response->set_vectors_dtype(index.vectors_dtype);
  response->set_default_refine_factor(
      static_cast<uint32_t>(limits.default_refine_factor));
  response->set_max_refine_factor(
      static_cast<uint32_t>(limits.max_refine_factor));
  response->set_defaults_source(DefaultsSourceName(limits.defaults_source));
  response->set_tuned_k(static_cast<uint32_t>(index.tuned_k));
  response->set_target_recall(index.target_recall);
  response->set_tuned_recall(index.tuned_recall);
  if (index.shard_count > 0) SetShard(index, response->mutable_shard());
  for (int64_t version : holder_->RetainedVersions()) {
    response->add_retained_versions(version);
  }
  finish(absl::OkStatus());
}

}  // namespace knnd
