// AdminServiceImpl: the gRPC handlers of knnd.v1.AdminService (index version
// control). ReloadIndex goes through IndexManager, the same serialised path
// as SIGHUP and polling, and blocks until the reload ends, so the handlers
// run on two threads of the service's own (a reload on one, a ListVersions
// beside it), never on the completion queue threads that serve searches.
// At most kMaxAdminCalls wait or run at once; more are refused
// RESOURCE_EXHAUSTED.
//
// Calls are first checked against `auth`'s admin tokens.
//
// Ownership: borrows the index manager and authenticator, which must
// outlive it; destroy it after the listeners that serve it are closed.
// Thread-safety: handlers run concurrently; IndexManager serialises reloads.
#ifndef KNND_RPC_ADMIN_SERVICE_H_
#define KNND_RPC_ADMIN_SERVICE_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "knnd/lifecycle/index_manager.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/worker_pool.h"
#include "knnd/v1/admin_service.grpc.pb.h"

namespace knnd {

class AdminServiceImpl final : public AsyncService {
 public:
  static constexpr int kMaxAdminCalls = 16;

  AdminServiceImpl(IndexManager* manager, const TokenAuthenticator* auth);
  ~AdminServiceImpl() override;

  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override;

  // Admin calls waiting or running now (at most kMaxAdminCalls).
  int calls_in_progress() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  // The handlers (on the service's threads).
  grpc::Status ReloadIndex(grpc::ServerContext* context,
                           const knnd::v1::ReloadIndexRequest* request,
                           knnd::v1::ReloadIndexResponse* response);
  grpc::Status ListVersions(grpc::ServerContext* context,
                            const knnd::v1::ListVersionsRequest* request,
                            knnd::v1::ListVersionsResponse* response);

 private:
  using Async = knnd::v1::AdminService::AsyncService;
  using ReloadCall = UnaryCall<knnd::v1::ReloadIndexRequest,
                               knnd::v1::ReloadIndexResponse>;
  using ListCall = UnaryCall<knnd::v1::ListVersionsRequest,
                             knnd::v1::ListVersionsResponse>;

  // Runs `handler` for `call` on the service's threads, or refuses it when
  // kMaxAdminCalls are waiting or running.
  template <class Call, class Handler>
  void Run(Call* call, const char* method, Handler handler);

  IndexManager* const manager_;
  const TokenAuthenticator* const auth_;
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<WorkerPool> threads_;
  Async service_;
  UnaryMethod<Async, knnd::v1::ReloadIndexRequest,
              knnd::v1::ReloadIndexResponse>
      reload_;
  UnaryMethod<Async, knnd::v1::ListVersionsRequest,
              knnd::v1::ListVersionsResponse>
      list_;
};

}  // namespace knnd

#endif  // KNND_RPC_ADMIN_SERVICE_H_
