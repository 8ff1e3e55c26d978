// HealthService: knnd's grpc.health.v1.Health (Check and Watch), in place of
// gRPC's default service, so that its answers follow knnd's lifecycle alone:
//   - every service ("" and the names given) starts NOT_SERVING, so nothing
//     reads SERVING between the listener's start and the index being served;
//   - SetServing() changes every service at once and tells each open Watch;
//   - during the last moments of a shutdown (the CallHold is holding),
//     Check answers NOT_SERVING only once GOAWAY is out, as searches do;
//   - EndWatches() ends the open Watch streams with UNAVAILABLE "knnd is
//     shutting down" (Shutdown() would otherwise wait for them).
// An unknown service is NOT_FOUND for Check and SERVICE_UNKNOWN for Watch
// (whose stream stays open, as the protocol says).
//
// One instance per grpc::Server (a service is registered on one server);
// instances of one knnd are kept in step by the caller.
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
#include "knnd/rpc/call_hold.h"

namespace knnd {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // `services`: the names besides "" that are known. `hold` (may be null)
  // must outlive the service.
  HealthService(const std::vector<std::string>& services, CallHold* hold);
  ~HealthService() override;

  void SetServing(bool serving);
  // Ends every open Watch, and every later one at once.
  void EndWatches();

  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class WatchReactor;

  // The status of `service`, SERVICE_UNKNOWN for a name not served.
  ServingStatus StatusLocked(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(WatchReactor* watch);

  CallHold* const hold_;
  std::set<std::string> services_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  // Counts SetServing() calls: a watcher applies a status only if it is
  // newer than the one it has (a SetServing() may tell a new watcher before
  // its first answer does).
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool watches_ended_ ABSL_GUARDED_BY(mu_) = false;
  // Owned references: a reactor lives until gRPC's OnDone() and until no
  // SetServing()/EndWatches() holds it.
  std::set<std::shared_ptr<WatchReactor>> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnd

#endif  // KNND_RPC_HEALTH_SERVICE_H_
