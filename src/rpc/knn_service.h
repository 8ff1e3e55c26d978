// KnnServiceImpl: the gRPC handlers of knnd.v1.KnnService. Thin by design:
// pin the snapshot, parse and validate, admit through the gate, hand the job
// to the Batcher, and map the outcome to a gRPC status. Handlers never
// search, except a small request that finds a worker idle and nothing queued
// (Batcher inline_max_rows); they return and the reactor finishes on the
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
// Thread-safety: handlers run concurrently on gRPC's callback threads.
#ifndef KNND_RPC_KNN_SERVICE_H_
#define KNND_RPC_KNN_SERVICE_H_

#include <cstdint>

#include "absl/time/time.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/batcher.h"
#include "knnd/serving/index_holder.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/serving/search_request.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {

class KnnServiceImpl final : public knnd::v1::KnnService::CallbackService {
 public:
  struct Options {
    LimitsConfig limits;
    int64_t max_receive_message_bytes = 64 << 20;
    int retry_pushback_ms = 50;
    // Rows per FAISS call (the batcher's), for the memory estimate.
    int64_t max_batch_rows = 256;
    absl::Duration slow_request = absl::Milliseconds(250);  // 0: no log
  };

  KnnServiceImpl(const Options& options, IndexHolder* holder,
                 AdmissionGate* gate, Batcher* batcher, Metrics* metrics,
                 const TokenAuthenticator* auth, CallHold* hold = nullptr)
      : options_(options),
        holder_(holder),
        gate_(gate),
        batcher_(batcher),
        metrics_(metrics),
        auth_(auth),
        hold_(hold) {}

  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* context,
                                   const knnd::v1::SearchRequest* request,
                                   knnd::v1::SearchResponse* response) override;

  grpc::ServerUnaryReactor* GetIndexInfo(
      grpc::CallbackServerContext* context,
      const knnd::v1::GetIndexInfoRequest* request,
      knnd::v1::GetIndexInfoResponse* response) override;

 private:
  const Options options_;
  IndexHolder* const holder_;
  AdmissionGate* const gate_;
  Batcher* const batcher_;
  Metrics* const metrics_;
  const TokenAuthenticator* const auth_;
  CallHold* const hold_;
};

}  // namespace knnd

#endif  // KNND_RPC_KNN_SERVICE_H_
