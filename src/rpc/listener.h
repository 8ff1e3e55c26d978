// Listener: the one way knnd builds a gRPC server on an address: the
// credentials, the connection limits every client-facing port gets, gRPC's
// reflection on or off, and the services. The search API, the admin API
// and the plaintext health-only port are all built here.
//
// Thread-safety: BuildListener keeps no state; call it from one thread.
#ifndef KNND_RPC_LISTENER_H_
#define KNND_RPC_LISTENER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/statusor.h"

namespace knnd {

// The config's "Network" and "Security" connection limits.
struct ConnectionLimits {
  int64_t max_receive_message_bytes = 64 << 20;
  // 0 means never (GOAWAY after this age, so that clients reconnect and
  // re-resolve and long-lived connections spread over new replicas).
  uint32_t max_connection_age_ms = 0;
  uint32_t max_connection_age_grace_ms = 0;
  int max_concurrent_streams = 1000;
  int keepalive_min_ping_interval_ms = 5000;
  bool keepalive_permit_without_calls = false;
  int max_metadata_bytes = 16384;
  // gRPC's ResourceQuota for this server's buffers; 0: none.
  int64_t memory_quota_bytes = 0;
};

struct ListenerSpec {
  std::string address;  // host:port; port 0 picks a free one
  // What the error says the address is, e.g. "admin_listen_address".
  std::string role = "listen_address";
  std::shared_ptr<grpc::ServerCredentials> credentials;
  ConnectionLimits limits;
  bool reflection = false;
  // At least one: gRPC starts no server without a service.
  std::vector<grpc::Service*> services;
};

struct Listener {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Builds and starts the server; UNAVAILABLE "cannot listen on ROLE ADDRESS
// (address in use or invalid)" when it cannot bind.
absl::StatusOr<Listener> BuildListener(const ListenerSpec& spec);

// Stops `server` (if any) at once, cancelling the calls still open.
void ShutDownNow(grpc::Server* server);

}  // namespace knnd

#endif  // KNND_RPC_LISTENER_H_
