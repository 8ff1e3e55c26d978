// ShardFront's Get (shard_front.h): admitted as a Search is at the front
// (the token, the deadline, the gate with EstimateFrontGet's bytes), sent
// to every shard with every id, and merged: each id's record from the
// shard that holds it, in the order of the request's first mention of
// each id; an id no shard holds is missing. Every shard must answer (a
// shard that fails fails the call, naming it): an id of a shard that did
// not answer cannot be told missing.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "knnd/rpc/shard_front.h"
#include "knnd/rpc/shard_front_estimate.h"
#include "spdlog/spdlog.h"

namespace knnd {

// One Get: owned by its call (deleted when the call is), of gRPC or
// HTTP/JSON. Begin() on the call's thread, then the shards' answers on
// gRPC's threads; the last one gathers.
class ShardFront::GetFanOut final {
 public:
  GetFanOut(ShardFront* front, GetCall* call)
      : front_(front),
        call_(call),
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
    if (!front_->BeginFanOut(*call_, kGetMethod, answer, &facts)) return;
    absl::StatusOr<FrontDemand> demand =
        EstimateFrontGet(call_->request(), facts);
    if (!demand.ok()) {
      return admission.Refuse(RejectReason::kInvalid, demand.status(), answer);
    }
    absl::Time deadline = call_->deadline();
    if (deadline - arrival_ > absl::Hours(24)) {
      deadline = arrival_ + front_->options_.default_deadline;
    }
    absl::StatusOr<AdmissionGate::Ticket> ticket = admission.Admit(
        *call_, arrival_, deadline, {1, demand->bytes, 0}, answer);
    if (!ticket.ok()) return;
    ticket_ = std::move(*ticket);
    answer_bounds_ = std::move(demand->shard_answer_bytes);
    Scatter(deadline);
  }

  void OnCancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (const auto& sub : subs_) sub->context.TryCancel();
  }

 private:
  using Sub = ShardCall<knnd::v1::GetResponse>;

  void Scatter(absl::Time deadline) {
    const size_t n = front_->shards_.size();
    std::vector<Sub*> started;
    {
      absl::MutexLock lock(&mu_);
      remaining_.store(static_cast<int>(n), std::memory_order_relaxed);
      for (size_t i = 0; i < n; ++i) {
        subs_.push_back(std::make_unique<Sub>());
        Sub* sub = subs_.back().get();
        front_->PrepareShardCall(sub->context, deadline, cancelled_);
        started.push_back(sub);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      Sub* sub = started[i];
      sub->start = absl::Now();
      front_->shards_[i]->stub->async()->Get(
          &sub->context, &call_->request(), &sub->response,
          front_->ShardCallDone(i, sub, &remaining_, [this] { Gather(); }));
    }
  }

  // Every shard has answered or failed (no callback touches subs_ now).
  void Gather() {
    std::vector<ShardFailure> failed;
    for (size_t i = 0; i < subs_.size(); ++i) {
      const Sub& sub = *subs_[i];
      if (!sub.status.ok()) {
        failed.push_back({i, &sub.status, &sub.context});
      } else if (static_cast<int64_t>(sub.response.ByteSizeLong()) >
                 answer_bounds_[i]) {
        return Answer(absl::FailedPreconditionError(absl::StrCat(
            "the Get answer of target ", front_->shards_[i]->target, " is ",
            sub.response.ByteSizeLong(), " bytes, more than the ",
            answer_bounds_[i], " its GetIndexInfo bounds it to")));
      }
    }
    if (!failed.empty()) return Answer(front_->FailureStatus(call_, failed));
    absl::flat_hash_map<int64_t, knnd::v1::Record*> found;
    int64_t version = 0;
    int64_t serving = 0;
    for (const auto& sub : subs_) {
      knnd::v1::GetResponse& r = sub->response;
      for (knnd::v1::Record& record : *r.mutable_records()) {
        found.emplace(record.id(), &record);
      }
      version = version == 0 ? r.index_version()
                             : std::min(version, r.index_version());
      serving = serving == 0 ? r.serving_version()
                             : std::min(serving, r.serving_version());
    }
    knnd::v1::GetResponse* out = call_->response();
    absl::flat_hash_set<int64_t> seen;
    int64_t bytes = 0;
    for (int64_t id : call_->request().ids()) {
      if (!seen.insert(id).second) continue;
      auto it = found.find(id);
      if (it == found.end()) {
        out->add_missing(id);
        continue;
      }
      bytes += static_cast<int64_t>(it->second->ByteSizeLong());
      out->add_records()->Swap(it->second);
    }
    out->set_index_version(version);
    out->set_serving_version(serving);
    if (bytes > front_->options_.max_send_message_bytes) {
      out->Clear();
      return Answer(absl::ResourceExhaustedError(absl::StrCat(
          "the answer to Get of ", call_->request().ids_size(),
          " ids would be more than ", bytes,
          " bytes, more than max_send_message_bytes=",
          front_->options_.max_send_message_bytes,
          "; ask for fewer ids, fewer payload fields or no vectors")));
    }
    Answer(absl::OkStatus());
  }

  // Finishes the call; the last use of `this`. The shards' calls go first,
  // while the front is sure to be alive (as ShardFront::Call::Answer).
  void Answer(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      subs_.clear();
    }
    front_->metrics_->RecordRpc(Metrics::Rpc::kGet, call_->protocol(),
                                status.code(), absl::Now() - arrival_);
    if (!status.ok() && spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("Get from {} failed: {}", call_->peer(), status.ToString());
    }
    EndFanOut(ticket_, std::move(live_), call_, status);
  }

  ShardFront* const front_;
  GetCall* const call_;
  const absl::Time arrival_;
  std::shared_ptr<LiveCalls> live_;
  AdmissionGate::Ticket ticket_;
  std::vector<int64_t> answer_bounds_;
  std::atomic<int> remaining_{0};
  absl::Mutex mu_;
  // Filled once by Scatter; read by Gather after every callback has run.
  std::vector<std::unique_ptr<Sub>> subs_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

void ShardFront::Get(GetCall* call) { (new GetFanOut(this, call))->Begin(); }

}  // namespace knnd
