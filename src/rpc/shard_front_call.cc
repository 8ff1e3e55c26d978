// ShardFront's side of a Search (shard_front.h): the call that scatters it
// to every shard, gathers the answers and merges them, and the
// KnnService handlers that start it. The front's own state (shards,
// poller, readiness) is in shard_front.cc.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/base/saturating.h"
#include "knnd/rpc/knn_async_service.h"
#include "knnd/rpc/knn_service.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/rpc/shard_front.h"
#include "knnd/rpc/shard_front_estimate.h"
#include "knnd/rpc/shard_merge.h"
#include "knnd/rpc/status_util.h"
#include "spdlog/spdlog.h"

namespace knnd {

using knnd::v1::GetIndexInfoRequest;
using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

namespace {

// "shard 2 (10.0.0.3:50051)", or "target T" while its shard id is unknown.
std::string ShardName(const ShardFront::Shard& shard, bool known, int id) {
  return known ? absl::StrCat("shard ", id, " (", shard.target, ")")
               : absl::StrCat("target ", shard.target);
}

// A trailing metadata value of a finished client call, or "".
std::string Trailing(const grpc::ClientContext& context, const char* key) {
  const auto& trailing = context.GetServerTrailingMetadata();
  auto it = trailing.find(key);
  if (it == trailing.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

// ---------------------------------------------------------------------------
// One Search: admitted by the gate, sent to every shard, gathered, merged.
// Owned by its call (deleted when the call is), of gRPC or HTTP/JSON.
class ShardFront::Call final {
 public:
  using Unary = ShardFront::SearchCall;

  Call(ShardFront* front, Unary* call)
      : front_(front),
        call_(call),
        request_(&call->request()),
        response_(call->response()),
        arrival_(absl::Now()),
        live_(front_->CallBegun()) {
    call_->OnDone([this] { delete this; });
    call_->OnCancel([this] { OnCancel(); });
  }

  void Begin() {
    const SearchAdmission& admission = front_->admission_;
    const SearchAdmission::Answer answer = [this](const absl::Status& status) {
      Answer(status);
    };
    FrontFacts facts;
    if (!front_->BeginFanOut(*call_, kSearchMethod, answer, &facts)) return;
    // A filter too deep to read is refused here, never sent on.
    if (absl::Status s = CheckFilterParsed(*request_, facts.max_filter_depth);
        !s.ok()) {
      return admission.Refuse(RejectReason::kInvalid, s, answer);
    }
    absl::StatusOr<FrontDemand> demand = EstimateFrontSearch(*request_, facts);
    if (!demand.ok()) {
      return admission.Refuse(RejectReason::kInvalid, demand.status(), answer);
    }
    if (Saturated(demand->bytes)) {
      return admission.RefuseSaturated(demand->shape, answer);
    }
    deadline_ = call_->deadline();
    if (deadline_ - arrival_ > absl::Hours(24)) {
      deadline_ = arrival_ + front_->options_.default_deadline;
    }
    absl::StatusOr<AdmissionGate::Ticket> ticket =
        admission.Admit(*call_, arrival_, deadline_,
                        {demand->shape.queries, demand->bytes, 0}, answer);
    if (!ticket.ok()) return;
    // What the answers are held to: the bounds the estimate counted.
    bounds_ = std::move(facts.shards);
    // The shards get a little less time than the caller, so that a shard
    // that does not answer in time is known before the caller's deadline,
    // and the call still ends with the others' merged answer (partial
    // results) or an error naming that shard.
    shard_deadline_ =
        deadline_ - std::clamp((deadline_ - arrival_) / 10,
                               absl::Milliseconds(2), absl::Milliseconds(100));
    ticket_ = std::move(*ticket);
    sub_request_ = *request_;
    sub_request_.set_return_candidates(true);
    sub_request_.clear_allow_partial_results();
    // The shards' results come as bytes (no varint coding on either side);
    // a shard too old to know the flag answers with the repeated fields,
    // which the merge reads as well.
    sub_request_.set_results_as_bytes(true);
    // A caller may pin a version itself (then no retry moves it).
    caller_pinned_ = request_->index_version() > 0;
    Scatter(caller_pinned_ ? request_->index_version() : front_->set_version());
  }

  void OnCancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (const auto& sub : subs_) sub->context.TryCancel();
  }

 private:
  using Sub = ShardCall<SearchResponse>;

  // Sends the request to every shard, pinned to `version` (0: unpinned).
  void Scatter(int64_t version) {
    ++attempts_;
    pinned_ = version;
    if (version > 0) {
      sub_request_.set_index_version(version);
    } else {
      sub_request_.clear_index_version();
    }
    const size_t n = front_->shards_.size();
    std::vector<Sub*> started;
    {
      absl::MutexLock lock(&mu_);  // subs_ is empty (Gather took the last)
      for (size_t i = 0; i < n; ++i) subs_.push_back(std::make_unique<Sub>());
      remaining_.store(static_cast<int>(n), std::memory_order_relaxed);
      for (size_t i = 0; i < n; ++i) {
        Sub* sub = subs_[i].get();
        front_->PrepareShardCall(sub->context, shard_deadline_, cancelled_);
        started.push_back(sub);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      Sub* sub = started[i];
      sub->start = absl::Now();
      front_->shards_[i]->stub->async()->Search(
          &sub->context, &sub_request_, &sub->response,
          front_->ShardCallDone(i, sub, &remaining_, [this] { Gather(); }));
    }
  }

  // Every shard has answered or failed: learn versions, retry once when
  // the set's version moved, else merge or fail.
  void Gather() {
    // The round's calls, taken out of subs_ (which OnCancel reads): every
    // callback has run, so nothing else touches them any more, and a retry
    // fills subs_ with the next round's. Kept in gathered_ until the answer
    // (Answer() frees them first).
    {
      absl::MutexLock lock(&mu_);
      gathered_.clear();  // a previous round's
      gathered_.swap(subs_);
    }
    const std::vector<std::unique_ptr<Sub>>& subs = gathered_;
    const size_t n = front_->shards_.size();
    bool refused_version = false;
    std::vector<ShardAnswer> answers;
    std::vector<size_t> answered;  // the target of each answer
    std::vector<size_t> failed;
    for (size_t i = 0; i < n; ++i) {
      const Sub& sub = *subs[i];
      if (sub.status.ok()) {
        front_->NoteServingVersion(i, sub.response.serving_version());
        answers.push_back({&sub.response, front_->shards_[i]->target});
        answered.push_back(i);
        continue;
      }
      failed.push_back(i);
      int64_t serving = 0;
      if (sub.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
          absl::SimpleAtoi(Trailing(sub.context, kServingVersionMetadata),
                           &serving) &&
          serving > 0) {
        front_->NoteServingVersion(i, serving);
        refused_version = true;
      }
    }
    const bool mixed =
        std::any_of(answers.begin(), answers.end(), [&](const ShardAnswer& a) {
          return a.response->index_version() !=
                 answers.front().response->index_version();
        });
    if ((refused_version || mixed) && !caller_pinned_ && attempts_ < 2 &&
        absl::Now() < shard_deadline_) {
      const int64_t version = front_->set_version();
      if (version != pinned_ || mixed) {
        Scatter(version);
        return;
      }
    }
    if (!failed.empty() &&
        (!request_->allow_partial_results() || answers.empty())) {
      std::vector<ShardFailure> failures;
      for (size_t i : failed) {
        failures.push_back({i, &subs[i]->status, &subs[i]->context});
      }
      Answer(front_->FailureStatus(call_, failures));
      return;
    }
    // A hybrid request's shards answer their windows, fused here over the
    // set (shard_merge.h).
    const bool hybrid = request_->texts_size() > 0;
    const HybridMerge hybrid_merge =
        hybrid ? HybridMergeOf(*request_) : HybridMerge();
    if (absl::Status s =
            hybrid
                ? CheckHybridAnswers(answers, static_cast<int>(n), hybrid_merge)
                : CheckShardAnswers(answers, static_cast<int>(n),
                                    request_->k());
        !s.ok()) {
      Answer(s);
      return;
    }
    // No payload beyond what its shard declared is merged or forwarded.
    for (size_t j = 0; j < answers.size(); ++j) {
      const size_t i = answered[j];
      int id = 0;
      const bool known = front_->ShardIdOf(i, &id);
      if (absl::Status s = CheckAnswerWithinBounds(
              *answers[j].response, bounds_[i],
              ShardName(*front_->shards_[i], known, id));
          !s.ok()) {
        Answer(s);
        return;
      }
    }
    if (absl::Status s =
            hybrid ? MergeHybridAnswers(
                         answers, hybrid_merge, request_->results_as_bytes(),
                         front_->options_.max_send_message_bytes, response_)
                   : MergeShardAnswers(
                         answers, request_->k(), request_->results_as_bytes(),
                         front_->options_.max_send_message_bytes, response_);
        !s.ok()) {
      response_->Clear();
      Answer(s);
      return;
    }
    // The shards that answered: CheckShardAnswers refused an id outside
    // [0, n) above, and the index is bounded here again, where it is used.
    std::vector<bool> present(n, false);
    for (const ShardAnswer& a : answers) {
      const size_t id = a.response->shard().shard_id();
      if (id < n) present[id] = true;
    }
    for (size_t id = 0; id < n; ++id) {
      if (!present[id]) response_->add_missing_shards(static_cast<uint32_t>(id));
    }
    if (response_->payloads_size() > 0) {
      int64_t payload_bytes = 0;
      for (const std::string& p : response_->payloads()) {
        payload_bytes += static_cast<int64_t>(p.size());
      }
      front_->metrics_->RecordPayloadBytes(payload_bytes);
    }
    Answer(absl::OkStatus());
  }

  // Finishes the call; the last use of `this` (the call's end deletes it).
  void Answer(const absl::Status& status) {
    // The shards' calls go first, while the front is sure to be alive:
    // each context holds its shard's channel, and once CallEnded() lets the
    // front's destructor go on, a context freed after it could drop a
    // channel's last reference on gRPC's own callback thread, whose queue
    // that channel's end would then delete under it (a crash seen when
    // large answers made the freeing slow).
    gathered_.clear();
    const absl::Duration total = absl::Now() - arrival_;
    front_->metrics_->RecordRpc(Metrics::Rpc::kSearch, call_->protocol(),
                                status.code(), total);
    if (!status.ok() && spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("Search from {} failed: {}", call_->peer(),
                    status.ToString());
    } else if (status.ok() &&
               front_->options_.slow_request > absl::ZeroDuration() &&
               total > front_->options_.slow_request) {
      spdlog::warn("slow Search from {} over {} shards: {} ({} attempts)",
                   call_->peer(), front_->shards_.size(),
                   absl::FormatDuration(total), attempts_);
    }
    // `this` may be gone after it; the front stays until every call has
    // ended.
    EndFanOut(ticket_, std::move(live_), call_, status);
  }

  ShardFront* const front_;
  Unary* const call_;
  const SearchRequest* const request_;
  SearchResponse* const response_;
  const absl::Time arrival_;
  std::shared_ptr<LiveCalls> live_;
  absl::Time deadline_;
  absl::Time shard_deadline_;
  AdmissionGate::Ticket ticket_;
  // Per target, the payload bound its answer is held to (set on
  // admission; read by Gather).
  std::vector<ShardBounds> bounds_;
  SearchRequest sub_request_;
  int attempts_ = 0;
  int64_t pinned_ = 0;
  bool caller_pinned_ = false;
  std::atomic<int> remaining_{0};
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Sub>> subs_ ABSL_GUARDED_BY(mu_);
  // The last round's calls, once all have ended: touched only by Gather
  // and Answer, which never run at the same time.
  std::vector<std::unique_ptr<Sub>> gathered_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------
bool ShardFront::BeginFanOut(const ServerCallBase& call,
                             absl::string_view method,
                             const SearchAdmission::Answer& answer,
                             FrontFacts* facts) const {
  if (!admission_.Authorize(call, answer, method)) return false;
  // A poll that missed its deadline does not make the front forget.
  *facts = Facts();
  if (facts->dim > 0) return true;
  admission_.Refuse(RejectReason::kNotReady, ready(), answer);
  return false;
}

void ShardFront::EndFanOut(AdmissionGate::Ticket& ticket,
                           std::shared_ptr<LiveCalls> live,
                           ServerCallBase* call, const absl::Status& status) {
  ticket.Release();
  call->Answer(status);
  CallEnded(std::move(live));
}

absl::Status ShardFront::FailureStatus(
    ServerCallBase* call, const std::vector<ShardFailure>& failed) const {
  std::vector<std::string> parts;
  int64_t pushback = -1;
  for (const ShardFailure& f : failed) {
    const Shard& shard = *shards_[f.shard];
    int id = 0;
    const bool known = ShardIdOf(f.shard, &id);
    parts.push_back(absl::StrCat(ShardName(shard, known, id), ": ",
                                 f.status->error_message()));
    int64_t ms = 0;
    if (f.status->error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::SimpleAtoi(Trailing(*f.context, kPushbackMetadata), &ms)) {
      pushback = std::max(pushback, ms);
    }
  }
  const grpc::Status& first = *failed.front().status;
  if (first.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    call->AddTrailer(
        kPushbackMetadata,
        std::to_string(pushback >= 0 ? pushback : options_.retry_pushback_ms));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(first.error_code()),
      absl::StrCat(failed.size(), " of ", shards_.size(),
                   " shards failed: ", absl::StrJoin(parts, "; ")));
}

void ShardFront::Search(SearchCall* call) { (new Call(this, call))->Begin(); }

void ShardFront::GetIndexInfo(InfoCall* call) {
  // Counted as a live call too: the front's state it reads stays until the
  // call has ended.
  std::shared_ptr<LiveCalls> live = CallBegun();
  const absl::Time arrival = absl::Now();
  absl::Status status =
      call->Authorize(*auth_, "/knnd.v1.KnnService/GetIndexInfo");
  if (status.ok()) status = SetInfo(call->response());
  metrics_->RecordRpc(Metrics::Rpc::kGetIndexInfo, call->protocol(),
                      status.code(), absl::Now() - arrival);
  call->Answer(status);
  CallEnded(std::move(live));
}

class ShardFront::Service final : public AsyncService {
 public:
  using Async = KnnAsyncService;

  explicit Service(ShardFront* front)
      : search_(&service_, &Async::RequestSearch,
                [front](SearchCall* call) { front->Search(call); }),
        info_(&service_, &Async::RequestGetIndexInfo,
              [front](InfoCall* call) { front->GetIndexInfo(call); }),
        get_(&service_, &Async::RequestGet,
             [front](GetCall* call) { front->Get(call); }) {}

  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override {
    search_.Listen(queue, queue.request_reads);
    info_.Listen(queue);
    get_.Listen(queue);
  }

 private:
  Async service_;
  // Read on match, as knnd's own Search (knn_async_service.h): a flood of
  // large requests waits in gRPC's queue of calls instead of being read at
  // once.
  ReadOnMatchMethod<Async, SearchRequest, SearchResponse> search_;
  UnaryMethod<Async, GetIndexInfoRequest, GetIndexInfoResponse> info_;
  UnaryMethod<Async, knnd::v1::GetRequest, knnd::v1::GetResponse> get_;
};

std::unique_ptr<AsyncService> ShardFront::NewService(ShardFront* front) {
  return std::make_unique<Service>(front);
}

}  // namespace knnd
