// ShardFront: knnd as the front of a sharded index (config shard_targets;
// docs/sharding.md). It holds no index: every Search goes to every shard,
// pinned to the newest version all of them serve, within the caller's
// deadline, and their answers are merged (shard_merge.h) into the answer
// of the unsharded index; a Get goes to every shard too, its records
// merged by id (shard_front_get.cc). Callers in any language then need no
// merging of their own: they call the front as they would call one knnd.
//
// A poller asks every shard for its GetIndexInfo every poll_interval: the
// front is ready (serving_changed(true): health SERVING) while every shard
// answers, from one build, with distinct shard ids covering the set; the
// answers also teach it each shard's serving version. Searches are taken
// once any shard has answered a poll, ready or not, so that a caller who
// allows partial results is served while a shard is down. Search answers teach
// it too, and a shard that no longer has the pinned version says which it
// serves (kServingVersionMetadata): the front then retries the call once with
// the new set version while the deadline allows.
//
// Ownership: owns the shards' channels and the poller thread; borrows the
// gate, metrics, authenticator and hold, which must outlive it.
// Thread-safety: all methods are safe to call concurrently; Stop() before
// destruction (the destructor calls it).
#ifndef KNND_RPC_SHARD_FRONT_H_
#define KNND_RPC_SHARD_FRONT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/rpc/search_request_codec.h"  // before the service is used
#include "knnd/rpc/shard_front_estimate.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {

class ShardFront {
 public:
  struct Options {
    // One gRPC target per shard, in any order.
    std::vector<std::string> targets;
    // Sent to every shard as "authorization: Bearer <token>"; empty: none.
    std::string shard_token;
    // How the front connects to the shards (transport_security.h's
    // MakeShardChannelCredentials); null: plaintext.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    absl::Duration poll_interval = absl::Seconds(1);
    // The deadline of a call whose caller set none (or one over a day).
    absl::Duration default_deadline = absl::Seconds(30);
    int retry_pushback_ms = 50;
    // Largest answer accepted from one shard (the shards' channels refuse
    // larger ones); also the most a shard may report as its
    // max_payload_bytes (shard_front_estimate.h).
    int64_t max_shard_response_bytes = int64_t{256} << 20;
    // Largest merged answer (payloads included) sent, in bytes.
    int64_t max_send_message_bytes = int64_t{64} << 20;
    absl::Duration slow_request = absl::Milliseconds(250);  // 0: no log
  };

  // Reads nothing and connects lazily: shards need not be up yet.
  // INVALID_ARGUMENT for no targets or more than kMaxShards.
  static absl::StatusOr<std::unique_ptr<ShardFront>> Create(
      const Options& options, AdmissionGate* gate, Metrics* metrics,
      const TokenAuthenticator* auth, CallHold* hold,
      std::function<void(bool)> serving_changed);
  ~ShardFront();

  // The knnd.v1.KnnService the front serves over gRPC.
  AsyncService* service();

  // Its handlers, for any protocol (server_call.h): the gRPC service above
  // and the HTTP/JSON listener (http_api.h) call them.
  using SearchCall =
      ServerCall<knnd::v1::SearchRequest, knnd::v1::SearchResponse>;
  using InfoCall =
      ServerCall<knnd::v1::GetIndexInfoRequest, knnd::v1::GetIndexInfoResponse>;
  using GetCall = ServerCall<knnd::v1::GetRequest, knnd::v1::GetResponse>;
  void Search(SearchCall* call);
  void GetIndexInfo(InfoCall* call);
  // Every shard is asked for every id (an id lives in one shard; the
  // others name it missing); the records are merged in the request's
  // order and an id no shard holds is missing. Every shard must answer:
  // a Get has no partial results (shard_front_get.cc).
  void Get(GetCall* call);

  // Starts the poller (the first poll runs at once).
  void Start();
  // Stops the poller; waits for a poll in progress.
  void Stop();

  // Search calls begun and not yet answered; the destructor waits until
  // there are none.
  struct LiveCalls;
  // Bracket every Search call (Call's constructor and its answer). The
  // call keeps what CallBegun returns and hands it to CallEnded after its
  // last use of the front: the count is shared, so that its mutex outlives
  // the end of a call's unlock on a gRPC thread even when the destructor,
  // woken by that unlock, has already returned.
  std::shared_ptr<LiveCalls> CallBegun();
  static void CallEnded(std::shared_ptr<LiveCalls> calls);

  // The set's version: the lowest serving version of the shards (0 while
  // one is unknown).
  int64_t set_version() const;

  // The last poll's verdict: OK while every shard answers, from one build,
  // covering the set; else why not (UNAVAILABLE).
  absl::Status ready() const;

  // From a shard answering now, else the last answer of any shard: the
  // index's dim (0 while no shard ever answered), the set's build id.
  int dim() const;
  std::string build_id() const;
  // What a Search is sized with (shard_front_estimate.h), from the shards'
  // last polls that passed CheckShardDeclared: dim and default
  // refine_factor as dim() takes them, the limits every shard accepts, and
  // per target its payload and answer bounds (a target that never
  // answered such a poll gets the largest of the others').
  FrontFacts Facts() const;
  // The shard id target `shard` last reported; false while unknown.
  bool ShardIdOf(size_t shard, int* id) const;
  // GetIndexInfo of the set: shard 0's answer with the counts and sizes
  // summed, the limits every shard accepts, the set's version, and `shard`
  // describing the set; UNAVAILABLE (why) while not ready.
  absl::Status SetInfo(knnd::v1::GetIndexInfoResponse* response) const;

  struct Shard;   // one target's channel and what is known of it
  class Call;     // one Search: scatter, gather, merge (shard_front_call.cc)
  class GetFanOut;  // one Get (shard_front_get.cc)
  class Service;  // the KnnService handlers

 private:
  ShardFront(const Options& options, AdmissionGate* gate, Metrics* metrics,
             const TokenAuthenticator* auth, CallHold* hold,
             std::function<void(bool)> serving_changed);

  // The KnnService handlers (shard_front_call.cc).
  static std::unique_ptr<AsyncService> NewService(ShardFront* front);
  // Adds "authorization: Bearer <token>" unless `token` is empty.
  static void AddShardToken(grpc::ClientContext& context,
                            const std::string& token);

  // One call of a fan-out (a Search's, a Get's) to one shard.
  template <class Response>
  struct ShardCall {
    grpc::ClientContext context;
    Response response;
    grpc::Status status;
    absl::Time start;
  };
  // Sets up a shard call's context: the deadline, the shard token, and
  // cancelled at once when the caller has already gone.
  void PrepareShardCall(grpc::ClientContext& context, absl::Time deadline,
                        bool cancelled) const {
    context.set_deadline(absl::ToChronoTime(deadline));
    AddShardToken(context, options_.shard_token);
    if (cancelled) context.TryCancel();
  }
  // The callback of `call` to shard `shard`: records the shard call's
  // metric, keeps its status, and runs `gather` when it is the last of the
  // `remaining` calls of its fan-out to end.
  template <class Response, class Gather>
  auto ShardCallDone(size_t shard, ShardCall<Response>* call,
                     std::atomic<int>* remaining, Gather gather) {
    return [this, shard, call, remaining, gather](grpc::Status status) {
      metrics_->RecordShardCall(
          static_cast<int>(shard),
          static_cast<absl::StatusCode>(status.error_code()),
          absl::Now() - call->start);
      call->status = std::move(status);
      if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1) gather();
    };
  }

  // How every fan-out begins: the caller's token for `method`, then the
  // facts of the shards, which a front that has never heard of any shard
  // lacks (refused UNAVAILABLE: not ready() itself, so that with a shard
  // down a call that allows partial results is still answered, and any
  // other fails naming the shard). False when `answer` was called.
  bool BeginFanOut(const ServerCallBase& call, absl::string_view method,
                   const SearchAdmission::Answer& answer,
                   FrontFacts* facts) const;
  // How every fan-out ends: its gate ticket released, `call` answered, and
  // the live call `live` ended, after which `this` may be gone.
  static void EndFanOut(AdmissionGate::Ticket& ticket,
                        std::shared_ptr<LiveCalls> live, ServerCallBase* call,
                        const absl::Status& status);

  // One shard's failed call, for FailureStatus().
  struct ShardFailure {
    size_t shard = 0;
    const grpc::Status* status = nullptr;
    const grpc::ClientContext* context = nullptr;
  };
  // The status of a call whose shards `failed` (not empty): the first
  // failure's code, a message naming every failed shard; a
  // RESOURCE_EXHAUSTED one adds to `call`'s trailers the largest pushback
  // a shard asked for.
  absl::Status FailureStatus(ServerCallBase* call,
                             const std::vector<ShardFailure>& failed) const;

  void PollLoop();
  // Asks every shard for its info in parallel, waits for all (each within
  // the poll interval) and records the verdict.
  void PollOnce();
  // Records a shard's serving version (from an answer or a refusal).
  void NoteServingVersion(size_t shard, int64_t version);
  // Recomputes ready_ from the shards' last info; under mu_.
  void UpdateReadiness() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t SetVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const knnd::v1::GetIndexInfoResponse* KnownInfoLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The largest answer a shard sends, as the front counts it: its
  // max_send_message_bytes, at most max_shard_response_bytes.
  int64_t AnswerBytesOf(const knnd::v1::GetIndexInfoResponse& info) const;

  const Options options_;
  Metrics* const metrics_;
  const TokenAuthenticator* const auth_;
  const SearchAdmission admission_;
  const std::function<void(bool)> serving_changed_;
  std::vector<std::unique_ptr<Shard>> shards_;
  const knnd::v1::GetIndexInfoRequest empty_info_request_;
  std::unique_ptr<AsyncService> service_;

  // Calls begun and not yet answered: the destructor waits for them, since
  // their shards' answers arrive on gRPC's threads, which the server's
  // shutdown does not wait for.
  const std::shared_ptr<LiveCalls> live_calls_;

  mutable absl::Mutex mu_;
  absl::Status ready_ ABSL_GUARDED_BY(mu_);
  bool announced_ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread poller_;
};

struct ShardFront::Shard {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub;
  // Guarded by ShardFront::mu_: the last poll's outcome, and the serving
  // version last heard of (from a poll, an answer or a refusal). `info` is
  // the last answer that passed CheckShardDeclared (a poll whose values are
  // out of range fails, naming them, and leaves it as it was).
  absl::Status polled = absl::UnavailableError("not polled yet");
  knnd::v1::GetIndexInfoResponse info;
  int64_t serving_version = 0;
  // The shard id it last reported (-1: never), kept while it is down so
  // that errors still name it.
  int shard_id = -1;
};

}  // namespace knnd

#endif  // KNND_RPC_SHARD_FRONT_H_
