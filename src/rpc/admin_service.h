// AdminServiceImpl: the gRPC handlers of knnd.v1.AdminService (index version
// control). ReloadIndex goes through IndexManager, the same serialised path
// as SIGHUP and polling, and blocks until the reload ends, so it uses gRPC's
// synchronous API (its own thread pool) rather than the callback threads
// that serve searches.
//
// Calls are first checked against `auth`'s admin tokens.
//
// Ownership: borrows the index manager and authenticator, which must
// outlive it.
// Thread-safety: handlers run concurrently; IndexManager serialises reloads.
#ifndef KNND_RPC_ADMIN_SERVICE_H_
#define KNND_RPC_ADMIN_SERVICE_H_

#include "knnd/lifecycle/index_manager.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/v1/admin_service.grpc.pb.h"

namespace knnd {

class AdminServiceImpl final : public knnd::v1::AdminService::Service {
 public:
  AdminServiceImpl(IndexManager* manager, const TokenAuthenticator* auth)
      : manager_(manager), auth_(auth) {}

  grpc::Status ReloadIndex(grpc::ServerContext* context,
                           const knnd::v1::ReloadIndexRequest* request,
                           knnd::v1::ReloadIndexResponse* response) override;

  grpc::Status ListVersions(grpc::ServerContext* context,
                            const knnd::v1::ListVersionsRequest* request,
                            knnd::v1::ListVersionsResponse* response) override;

 private:
  IndexManager* const manager_;
  const TokenAuthenticator* const auth_;
};

}  // namespace knnd

#endif  // KNND_RPC_ADMIN_SERVICE_H_
