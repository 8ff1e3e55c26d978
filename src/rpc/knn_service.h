// KnnServiceImpl: the gRPC handlers of knnd.v1.KnnService over the local
// index. A Search is a few named steps: authorize, pin the snapshot (the
// version asked for, else the serving one) and parse the request against
// it, admit (search_admission.h: the deadline, the gate, refusals counted
// and answered), then hand the job to the Batcher, which answers the call
// when its last unit is done: on a worker thread, or on this one for a
// small request that finds a worker idle and nothing queued (Batcher
// inline_max_rows).
//
// Every call is counted in `metrics` (by protocol), rejections by reason.
// The handlers see a ServerCall (server_call.h), so the HTTP/JSON listener
// (http_api.h) serves the same Search, Get and GetIndexInfo as gRPC.
//
// Search is registered as a stream and served by ReadOnMatchMethod
// (knn_async_service.h): a call's message is read only when one of the
// listener's reads is free, so that gRPC never holds a flood of large
// requests at once (and never cuts admitted calls to free memory).
//
// Ownership: borrows the holder, gate, batcher, metrics, authenticator and
// hold, which must outlive it.
// Thread-safety: handlers run concurrently on the listener's completion
// queue threads (async_call.h).
#ifndef KNND_RPC_KNN_SERVICE_H_
#define KNND_RPC_KNN_SERVICE_H_

#include <cstdint>

#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "knnd/index/memory_model.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/knn_async_service.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/rpc/search_request_codec.h"  // before the service is used
#include "knnd/rpc/server_call.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/batcher.h"
#include "knnd/serving/index_holder.h"
#include "knnd/serving/search_request.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {

// Trailing metadata of a Search refused FAILED_PRECONDITION because the
// index_version it pinned is not loaded: the version serving, in decimal,
// from which a merger of shards learns the set's version
// (docs/sharding.md).
inline constexpr char kServingVersionMetadata[] = "knnd-serving-version";

class KnnServiceImpl final : public AsyncService {
 public:
  struct Options {
    LimitsConfig limits;
    int64_t max_receive_message_bytes = 64 << 20;
    // The largest answer (payloads included) sent, in bytes.
    int64_t max_send_message_bytes = 64 << 20;
    int retry_pushback_ms = 50;
    // Rows per FAISS call (the batcher's), for the memory estimate.
    int64_t max_batch_rows = 128;
    absl::Duration slow_request = absl::Milliseconds(250);  // 0: no log
  };

  // The handlers take a protocol-neutral call (server_call.h): gRPC's
  // UnaryCall, or an HTTP/JSON call (http_api.h).
  using SearchCall =
      ServerCall<knnd::v1::SearchRequest, knnd::v1::SearchResponse>;
  using InfoCall =
      ServerCall<knnd::v1::GetIndexInfoRequest, knnd::v1::GetIndexInfoResponse>;
  using GetCall = ServerCall<knnd::v1::GetRequest, knnd::v1::GetResponse>;

  KnnServiceImpl(const Options& options, IndexHolder* holder,
                 AdmissionGate* gate, Batcher* batcher, Metrics* metrics,
                 const TokenAuthenticator* auth, CallHold* hold = nullptr);

  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override;

  void Search(SearchCall* call);
  void GetIndexInfo(InfoCall* call);
  // The records of the ids asked (index/get_records.h), through the same
  // token check, version pinning, deadline and gate as Search; the answer
  // is built on the calling thread (a few mapped rows per id, no search),
  // its bytes charged to the gate while it is built and sent.
  void Get(GetCall* call);

 private:
  using Async = KnnAsyncService;

  // The snapshot a Search runs on, and the version serving when it was
  // pinned.
  struct Pinned {
    std::shared_ptr<const IndexSnapshot> snapshot;
    int64_t serving_version = 0;
  };

  // Records the RPC and finishes `call` with a status.
  SearchAdmission::Answer AnswerFor(SearchCall* call, absl::Time arrival) const;
  // Pins the snapshot the request asks for and validates the request
  // against it; on failure `reason` says how the refusal is counted.
  absl::StatusOr<ParsedSearch> PinAndParse(SearchCall* call, Pinned* pinned,
                                           RejectReason* reason) const;
  // Pins version `wanted` (0: the serving one); FAILED_PRECONDITION naming
  // the versions loaded, with the serving one in `call`'s trailers, when
  // it is not loaded; the holder's status (counted kNotReady) when none is.
  absl::Status PinVersion(ServerCallBase* call, int64_t wanted, Pinned* pinned,
                          RejectReason* reason) const;
  // `payload_entries`: the results whose payloads the answer carries (0:
  // none asked for).
  SearchShape ShapeOf(const ParsedSearch& parsed, const IndexInfo& index,
                      int64_t payload_entries) const;
  // The admitted job: the answer's header set and its result arrays sized
  // for the search to fill in place; on_done adds the payloads asked for
  // (search_payloads.h) and answers the call.
  std::unique_ptr<SearchJob> MakeJob(
      SearchCall* call, Pinned pinned, ParsedSearch parsed,
      absl::optional<PayloadSelection> payloads, const SearchShape& shape,
      AdmissionGate::Ticket ticket, absl::Time arrival) const;

  const Options options_;
  IndexHolder* const holder_;
  Batcher* const batcher_;
  Metrics* const metrics_;
  const TokenAuthenticator* const auth_;
  const SearchAdmission admission_;
  Async service_;
  ReadOnMatchMethod<Async, knnd::v1::SearchRequest, knnd::v1::SearchResponse>
      search_;
  UnaryMethod<Async, knnd::v1::GetIndexInfoRequest,
              knnd::v1::GetIndexInfoResponse>
      info_;
  UnaryMethod<Async, knnd::v1::GetRequest, knnd::v1::GetResponse> get_;
};

}  // namespace knnd

#endif  // KNND_RPC_KNN_SERVICE_H_
