// KnnServiceImpl: the gRPC handlers of knnd.v1.KnnService. Thin by design:
// pin the snapshot, parse and validate, admit through the gate, hand the job
// to the Batcher, and map the outcome to a gRPC status. Handlers never
// search, except a small request that finds a worker idle and nothing queued
// (Batcher inline_max_rows); they return and the call finishes on the
// thread that ran the search.
//
// Every call is counted in `metrics`, rejections by reason.
//
// Calls are first checked against `auth`'s bearer tokens.
//
// Once the gate drains (shutdown), new searches are refused UNAVAILABLE at
// once; while `hold` is holding (the moments around GOAWAY) the refusal is
// sent only when the hold lets go (see call_hold.h).
//
// Ownership: borrows the holder, gate, batcher, metrics, authenticator and
// hold, which must outlive it.
// Thread-safety: handlers run concurrently on the listener's completion
// queue threads (async_call.h).
#ifndef KNND_RPC_KNN_SERVICE_H_
#define KNND_RPC_KNN_SERVICE_H_

#include <cstdint>

#include "absl/time/time.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/batcher.h"
#include "knnd/serving/index_holder.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/serving/search_request.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/token_auth.h"
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
    int retry_pushback_ms = 50;
    // Rows per FAISS call (the batcher's), for the memory estimate.
    int64_t max_batch_rows = 256;
    absl::Duration slow_request = absl::Milliseconds(250);  // 0: no log
  };

  using SearchCall =
      UnaryCall<knnd::v1::SearchRequest, knnd::v1::SearchResponse>;
  using InfoCall = UnaryCall<knnd::v1::GetIndexInfoRequest,
                             knnd::v1::GetIndexInfoResponse>;

  KnnServiceImpl(const Options& options, IndexHolder* holder,
                 AdmissionGate* gate, Batcher* batcher, Metrics* metrics,
                 const TokenAuthenticator* auth, CallHold* hold = nullptr);

  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override;

  void Search(SearchCall* call);
  void GetIndexInfo(InfoCall* call);

 private:
  using Async = knnd::v1::KnnService::AsyncService;

  const Options options_;
  IndexHolder* const holder_;
  AdmissionGate* const gate_;
  Batcher* const batcher_;
  Metrics* const metrics_;
  const TokenAuthenticator* const auth_;
  CallHold* const hold_;
  Async service_;
  UnaryMethod<Async, knnd::v1::SearchRequest, knnd::v1::SearchResponse>
      search_;
  UnaryMethod<Async, knnd::v1::GetIndexInfoRequest,
              knnd::v1::GetIndexInfoResponse>
      info_;
};

}  // namespace knnd

#endif  // KNND_RPC_KNN_SERVICE_H_
