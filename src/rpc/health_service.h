// HealthService: knnd's grpc.health.v1.Health (Check and Watch), in place of
// gRPC's default service, so that its answers follow knnd's lifecycle alone:
//   - every service ("" and the names given) starts NOT_SERVING, so nothing
//     reads SERVING between the listener's start and the index being served;
//   - SetServing() changes every service at once and tells each open Watch
//     (SetStatuses() sets the named ones and "" apart);
//   - during the last moments of a shutdown (the CallHold is holding),
//     Check answers NOT_SERVING only once GOAWAY is out, as searches do;
//   - EndWatches() ends the open Watch streams with UNAVAILABLE "knnd is
//     shutting down" (Shutdown() would otherwise wait for them).
// An unknown service is NOT_FOUND for Check and SERVICE_UNKNOWN for Watch
// (whose stream stays open, as the protocol says).
//
// Served on the asynchronous API (async_call.h). One instance per
// grpc::Server (a service is registered on one server); instances of one
// knnd are kept in step by the caller.
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_RPC_HEALTH_SERVICE_H_
#define KNND_RPC_HEALTH_SERVICE_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/call_hold.h"

namespace knnd {

class HealthService final : public AsyncService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // `services`: the names besides "" that are known. `hold` (may be null)
  // must outlive the service.
  HealthService(const std::vector<std::string>& services, CallHold* hold);
  ~HealthService() override;

  void SetServing(bool serving) { SetStatuses(serving, serving); }
  // The named services' status and the server's own (""), apart: a front
  // of shards is alive ("" SERVING, for a liveness probe) while its
  // shards are not all up (its service NOT_SERVING, for readiness).
  void SetStatuses(bool services_serving, bool overall_serving);
  // Ends every open Watch, and every later one at once.
  void EndWatches();
  // What Check answers for `service` now (SERVICE_UNKNOWN for a name not
  // served): the HTTP listener's /healthz routes read it.
  ServingStatus StatusOf(const std::string& service) const;

  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override;

 private:
  using Async = grpc::health::v1::Health::AsyncService;
  using CheckCall = UnaryCall<grpc::health::v1::HealthCheckRequest,
                              grpc::health::v1::HealthCheckResponse>;
  class WatchStream;

  void Check(CheckCall* call);
  // Starts the Watch stream of `watch`, just matched.
  void Watch(const std::shared_ptr<WatchStream>& watch);

  // The status of `service`, SERVICE_UNKNOWN for a name not served.
  ServingStatus StatusLocked(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(WatchStream* watch);

  CallHold* const hold_;
  std::set<std::string> services_;
  Async service_;
  UnaryMethod<Async, grpc::health::v1::HealthCheckRequest,
              grpc::health::v1::HealthCheckResponse>
      check_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;          // named services
  bool overall_serving_ ABSL_GUARDED_BY(mu_) = false;  // ""

  // Counts SetServing() calls: a watcher applies a status only if it is
  // newer than the one it has (a SetServing() may tell a new watcher before
  // its first answer does).
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool watches_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Owned references: a stream lives until gRPC has returned all its
  // events and until no SetServing()/EndWatches() holds it.
  std::set<std::shared_ptr<WatchStream>> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnd

#endif  // KNND_RPC_HEALTH_SERVICE_H_
