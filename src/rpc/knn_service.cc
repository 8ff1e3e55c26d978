#include "knnd/rpc/knn_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "knnd/index/memory_model.h"
#include "knnd/serving/search_request.h"
#include "knnd/rpc/result_fields.h"
#include "knnd/rpc/status_util.h"
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

// Search requests kept posted on each queue: a burst of new calls is
// matched without waiting for each to post its successor.
constexpr int kPendingSearches = 4;

}  // namespace

KnnServiceImpl::KnnServiceImpl(const Options& options, IndexHolder* holder,
                               AdmissionGate* gate, Batcher* batcher,
                               Metrics* metrics,
                               const TokenAuthenticator* auth, CallHold* hold)
    : options_(options),
      holder_(holder),
      gate_(gate),
      batcher_(batcher),
      metrics_(metrics),
      auth_(auth),
      hold_(hold),
      search_(&service_, &Async::RequestSearch,
              [this](SearchCall* call) { Search(call); }),
      info_(&service_, &Async::RequestGetIndexInfo,
            [this](InfoCall* call) { GetIndexInfo(call); }) {}

void KnnServiceImpl::Listen(const ServingQueue& queue) {
  search_.Listen(queue, kPendingSearches);
  info_.Listen(queue);
}

void KnnServiceImpl::Search(SearchCall* call) {
  grpc::ServerContext* const context = call->context();
  const knnd::v1::SearchRequest* const request = &call->request();
  knnd::v1::SearchResponse* const response = call->response();
  const absl::Time arrival = absl::Now();
  auto finish = [&](const absl::Status& status) {
    // The peer and status strings are built only when debug logging is on
    // (refusals under overload take this path hundreds of times a second).
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("Search from {} failed: {}", context->peer(),
                    status.ToString());
    }
    metrics_->RecordRpc(Metrics::Rpc::kSearch, status.code(),
                        absl::Now() - arrival);
    call->Finish(ToGrpcStatus(status));
  };
  auto reject = [&](RejectReason reason, const absl::Status& status) {
    metrics_->RecordRejection(reason);
    finish(status);
  };
  if (absl::Status allowed =
          auth_->CheckCall(*context, "/knnd.v1.KnnService/Search");
      !allowed.ok()) {
    return finish(allowed);
  }

  // The version asked for (a merger of shards pins one), else the serving one.
  const int64_t wanted_version = request->index_version();
  if (wanted_version < 0) {
    return reject(RejectReason::kInvalid,
                  absl::InvalidArgumentError(absl::StrCat(
                      "index_version=", wanted_version, " must be >= 0")));
  }
  int64_t serving_version = 0;
  std::shared_ptr<const IndexSnapshot> snapshot =
      wanted_version > 0 ? holder_->PinVersion(wanted_version, &serving_version)
                         : holder_->Pin();
  if (snapshot == nullptr) {
    if (wanted_version > 0 && serving_version > 0) {
      context->AddTrailingMetadata(kServingVersionMetadata,
                                   std::to_string(serving_version));
      return reject(RejectReason::kInvalid,
                    absl::FailedPreconditionError(absl::StrCat(
                        "index_version=", wanted_version,
                        " is not loaded here: version ", serving_version,
                        " serves", RetainedNote(holder_->RetainedVersions()),
                        " (keep_previous_versions keeps replaced versions "
                        "loaded)")));
    }
    return reject(RejectReason::kNotReady, holder_->NotServingStatus());
  }
  const IndexInfo& index = snapshot->info();
  if (wanted_version == 0) serving_version = index.version;
  absl::StatusOr<ParsedSearch> parsed =
      ParseSearchRequest(*request, index, ResolveLimits(options_.limits, index));
  if (!parsed.ok()) return reject(RejectReason::kInvalid, parsed.status());

  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (deadline <= arrival) {
    return reject(RejectReason::kDeadline,
                  absl::DeadlineExceededError(
                      "the deadline had passed when the request arrived"));
  }

  SearchShape shape{parsed->num_queries, parsed->k, parsed->nprobe,
                    static_cast<int64_t>(parsed->allowed_ids.size()),
                    parsed->refine_factor, options_.max_batch_rows};
  RejectReason refused = RejectReason::kQueueFull;  // set on failure
  absl::StatusOr<AdmissionGate::Ticket> ticket = gate_->TryAdmitWork(
      parsed->num_queries, EstimateSearchBytes(index, shape),
      parsed->num_queries * std::max(parsed->nprobe, 1), &refused);
  if (!ticket.ok()) {
    if (absl::IsResourceExhausted(ticket.status())) {
      context->AddTrailingMetadata("grpc-retry-pushback-ms",
                                   std::to_string(options_.retry_pushback_ms));
    }
    if (refused == RejectReason::kDraining && hold_ != nullptr) {
      Metrics* metrics = metrics_;
      auto answer = [call, metrics, arrival, status = ticket.status()] {
        metrics->RecordRpc(Metrics::Rpc::kSearch, status.code(),
                           absl::Now() - arrival);
        call->Finish(ToGrpcStatus(status));
      };
      if (hold_->Hold(deadline, answer)) {
        metrics_->RecordRejection(refused);
        return;
      }
    }
    return reject(refused, ticket.status());
  }

  const bool candidates =
      request->return_candidates() && parsed->refine_factor > 0;
  const int width =
      candidates ? parsed->k * parsed->refine_factor : parsed->k;
  const int64_t results = parsed->num_queries * width;
  response->set_num_queries(static_cast<uint32_t>(parsed->num_queries));
  response->set_k(width);
  response->set_index_version(index.version);
  response->set_serving_version(serving_version);
  response->set_metric(ToProto(index.metric));
  response->set_nprobe(static_cast<uint32_t>(parsed->nprobe));
  response->set_refine_factor(static_cast<uint32_t>(parsed->refine_factor));
  if (index.shard_count > 0) SetShard(index, response->mutable_shard());
  const ResultBuffers out = ResizeResults(
      results, candidates, request->results_as_bytes(), 0.0f, response);

  auto job = std::make_unique<SearchJob>();
  job->snapshot = std::move(snapshot);
  job->query_storage = std::move(parsed->aligned_copy);
  job->queries = job->query_storage.empty() ? parsed->queries
                                            : job->query_storage.data();
  job->num_queries = parsed->num_queries;
  job->k = parsed->k;
  job->nprobe = parsed->nprobe;
  job->refine_factor = parsed->refine_factor;
  job->return_candidates = candidates;
  job->allowed_ids = std::move(parsed->allowed_ids);
  job->ids = out.ids;
  job->distances = out.distances;
  job->approx_distances = out.approx_distances;
  job->deadline = deadline;
  job->is_cancelled = [call] { return call->cancelled(); };
  job->ticket = std::move(*ticket);
  const absl::Duration slow = options_.slow_request;
  job->on_done = [call, context, arrival, slow, shape, metrics = metrics_](
                     const absl::Status& status, const JobTimes& times) {
    const absl::Duration total = absl::Now() - arrival;
    metrics->RecordSearchWork(shape.num_queries, times.queue, times.search);
    metrics->RecordRpc(Metrics::Rpc::kSearch, status.code(), total);
    if (!status.ok()) {
      if (spdlog::should_log(spdlog::level::debug)) {
        spdlog::debug("Search from {} failed after {}: {}", context->peer(),
                      absl::FormatDuration(total), status.ToString());
      }
    } else if (slow > absl::ZeroDuration() && total > slow) {
      spdlog::warn(
          "slow Search from {}: {} (queue {}, search {} in {} units), "
          "{} queries k={} nprobe={} refine_factor={} filter={}",
          context->peer(), absl::FormatDuration(total),
          absl::FormatDuration(times.queue), absl::FormatDuration(times.search),
          times.units, shape.num_queries, shape.k, shape.nprobe,
          shape.refine_factor, shape.filter_ids);
    }
    call->Finish(ToGrpcStatus(status));
  };
  batcher_->Submit(std::move(job));
}

void KnnServiceImpl::GetIndexInfo(InfoCall* call) {
  grpc::ServerContext* const context = call->context();
  knnd::v1::GetIndexInfoResponse* const response = call->response();
  const absl::Time arrival = absl::Now();
  auto finish = [&](const absl::Status& status) {
    metrics_->RecordRpc(Metrics::Rpc::kGetIndexInfo, status.code(),
                        absl::Now() - arrival);
    call->Finish(ToGrpcStatus(status));
  };
  if (absl::Status allowed =
          auth_->CheckCall(*context, "/knnd.v1.KnnService/GetIndexInfo");
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
  response->set_has_metadata(index.has_metadata);
  response->set_normalized(index.normalized);
  response->set_factory(index.factory);
  response->set_source(index.source);
  response->set_created(index.created);
  response->set_has_vectors(index.has_vectors);
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
