// Server: assembles knnd from its configuration and runs its lifecycle.
// Wiring only: every component's Options come from config/server_options.h,
// and policy lives in the components (memory budget, version preparation,
// listeners). The lifecycle:
//   Create()     build the worker pool, gate, batcher and gRPC service
//   Start()      listen (search API, admin API, /metrics, the plaintext
//                health-only port with TLS, and the HTTP/JSON API when
//                configured); grpc.health.v1 answers NOT_SERVING
//   LoadIndex()  load + check the index, run warm-up queries, publish it;
//                health turns SERVING (and NOT_SERVING again if the
//                index's background checksum check fails, until another
//                version is published); later versions come through
//                index_manager() (SIGHUP, polling, AdminService, tests),
//                each warmed up and canary-checked before it is published
//   Drain()      the shutdown (SIGTERM): health NOT_SERVING at once; for
//                the shutdown delay keep listening and serving searches
//                (clients and load balancers learn the replica is going);
//                then refuse new searches (UNAVAILABLE "knnd is shutting
//                down") while admitted ones finish within the grace
//                period; then close the listeners: GOAWAY, with the
//                answers to calls refused in that moment held until it is
//                out (rpc/call_hold.h), so that no call meets gRPC's
//                shut-down core (CANCELLED)
//
// Ownership: owns every component; the gRPC server is destroyed before the
// worker pool, so no call can outlive the threads that finish it.
// Thread-safety: Drain() may be called from a signal-handling thread while
// requests run, and EndShutdownDelay() from any thread; the lifecycle
// methods are otherwise called in order from one thread.
#ifndef KNND_SERVER_H_
#define KNND_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "knnd/lifecycle/index_manager.h"
#include "knnd/lifecycle/version_preparation.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/admin_service.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/health_service.h"
#include "knnd/rpc/http_server.h"
#include "knnd/rpc/knn_service.h"
#include "knnd/rpc/listener.h"
#include "knnd/rpc/shard_front.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/batcher.h"
#include "knnd/serving/heap_trimmer.h"
#include "knnd/serving/index_holder.h"
#include "knnd/serving/memory_budget.h"
#include "knnd/serving/worker_pool.h"
#include "knnd/v1/config.pb.h"

namespace knnd {

class Server {
 public:
  // `config` must have passed ValidateConfig().
  static absl::StatusOr<std::unique_ptr<Server>> Create(
      const knnd::v1::ServerConfig& config);
  ~Server();

  // How Drain() ends knnd (config: shutdown_delay_ms,
  // shutdown_delay_refuses_searches, drain_grace_period_ms).
  struct DrainPlan {
    // Health NOT_SERVING, still listening, before the drain begins.
    absl::Duration delay = absl::ZeroDuration();
    // Refuse searches during the delay too (default: serve them).
    bool refuse_during_delay = false;
    // Time admitted searches get to finish once the drain begins.
    absl::Duration grace = absl::ZeroDuration();
  };

  absl::Status Start();
  absl::Status LoadIndex();
  // Returns true when every admitted request finished within the grace.
  bool Drain(const DrainPlan& plan);
  // Ends Drain()'s shutdown delay now (a second SIGTERM or SIGINT).
  void EndShutdownDelay() { end_delay_.Notify(); }

  // The port the search API is bound to (useful with port 0).
  int port() const { return port_; }
  // The port of the plaintext health-only listener; 0 when there is none.
  int health_port() const { return health_port_; }
  // The port of the HTTP/JSON API; 0 when it is off (http_listen_address).
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }
  // Re-reads the bearer token files (SIGHUP); on error the old sets stay.
  absl::Status ReloadTokens() { return auth_->Reload(); }
  // The port of the admin API; 0 when it is off (or before Start()), the
  // search port when both share an address.
  int admin_port() const { return admin_port_; }
  // The port /metrics is served on; 0 before Start().
  int metrics_port() const { return metrics_->port(); }
  IndexHolder& holder() { return holder_; }
  // Not for a front of shards (shard_targets), which has no index.
  IndexManager& index_manager() { return *index_manager_; }
  // SIGHUP: a reload of the index on the index manager's thread (nothing
  // for a front of shards).
  void RequestReload();
  AdmissionGate& gate() { return *gate_; }
  int num_workers() const { return pool_->num_threads(); }

 private:
  explicit Server(const knnd::v1::ServerConfig& config) : config_(config) {}

  void SetServing(bool serving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(serving_mu_);
  // The end of Drain(): GOAWAY on every listener, with the hold on.
  void CloseListeners(absl::Time deadline);
  // The HTTP/JSON listener over the same handlers, when configured.
  absl::Status StartHttp(const ConnectionLimits& limits);
  // The index manager's serving_changed: SetServing() unless draining.
  void OnServingChanged(bool serving);

  const knnd::v1::ServerConfig config_;
  // Serialises health changes from the index manager's threads with
  // Drain(), after which they are ignored. Declared before the index
  // manager, whose threads use it until it is destroyed.
  absl::Mutex serving_mu_;
  bool draining_ ABSL_GUARDED_BY(serving_mu_) = false;
  IndexHolder holder_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<AdmissionGate> gate_;
  // The memory limit, the heap check and the gate's byte budget.
  std::unique_ptr<MemoryBudget> memory_budget_;
  // Gives freed heap memory back after bursts (heap_trim_interval_ms).
  std::unique_ptr<HeapTrimmer> heap_trimmer_;
  // Between the gate and pool it reads at scrape time and the batcher and
  // service that record into it: destroyed after its users, before its
  // sources.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<TokenAuthenticator> auth_;
  // Before the services that hold calls in it and the servers.
  CallHold hold_;
  absl::Notification end_delay_;
  std::unique_ptr<KnnServiceImpl> service_;  // null for a front of shards
  // grpc.health.v1 of the search port and of the health-only port.
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<HealthService> health_only_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  // After the services they serve, so that they close first.
  Listener search_listener_;
  // Serves only grpc.health.v1, in plaintext; closed without
  // health_listen_address.
  Listener health_listener_;
  // Closed when the admin API is off or shares search_listener_.
  Listener admin_listener_;
  // The HTTP/JSON API (http_listen_address), else null; closed with the
  // gRPC listeners.
  std::unique_ptr<HttpServer> http_;
  // The front of a sharded index (shard_targets), else null. After the
  // health services its poller reports to; its calls end before it goes
  // (the destructor shuts the servers down first).
  std::unique_ptr<ShardFront> front_;
  // Warm-up and canary of each version before it is published.
  std::unique_ptr<VersionPreparation> preparation_;
  // Last: its thread may be reloading (warm-up on the pool, publishing to
  // the holder, recording metrics) until it is destroyed, first.
  std::unique_ptr<IndexManager> index_manager_;
  int port_ = 0;
  int health_port_ = 0;
  int admin_port_ = 0;
};

}  // namespace knnd

#endif  // KNND_SERVER_H_
