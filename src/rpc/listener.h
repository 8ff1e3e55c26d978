// Listener: the one way knnd builds a gRPC server on an address: the
// credentials, the connection limits every client-facing port gets, gRPC's
// reflection on or off, and the services, served from completion queues
// that the listener's own threads drain (async_call.h). The search API, the
// admin API and the plaintext health-only port are all built here.
//
// Thread-safety: BuildListener keeps no state; call it from one thread.
// A Listener is closed by one thread.
#ifndef KNND_RPC_LISTENER_H_
#define KNND_RPC_LISTENER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "knnd/rpc/async_call.h"

namespace knnd {

// The config's "Network" and "Security" connection limits.
struct ConnectionLimits {
  int64_t max_receive_message_bytes = 64 << 20;
  int64_t max_send_message_bytes = 64 << 20;
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
  // gRPC's reflection (grpc.reflection.v1alpha), a synchronous service:
  // with it the server also runs gRPC's own pool of threads for it.
  bool reflection = false;
  // Completion queues (at least 1), each drained by `threads_per_queue`
  // threads.
  int queues = 1;
  int threads_per_queue = 1;
  // How long a thread polls its queue after each event before it sleeps
  // (CompletionQueueThreads::Start); 0: it sleeps at once.
  int poll_us = 0;
  // When set, a thread polls only while this returns true (knnd: while
  // every worker is idle, so that polling never takes a core from a
  // search).
  std::function<bool()> may_poll;
  // The name of those threads (at most 15 characters).
  const char* thread_name = "knnd-grpc";
  // At least one service, on the asynchronous API, or one on gRPC's
  // callback API (`callback_services`: only bench/noop_server --callback,
  // which measures the model knnd left; knnd registers none).
  std::vector<AsyncService*> services;
  std::vector<grpc::Service*> callback_services;
};

// A started server and the threads that drain its queues.
struct Listener {
  Listener() = default;
  Listener(Listener&&) = default;
  Listener& operator=(Listener&&) = default;
  ~Listener() { Close(absl::InfinitePast()); }

  bool open() const { return server != nullptr; }
  // Stops listening (GOAWAY), waits for the calls still open until
  // `deadline` and cancels the rest, then stops the queues' threads.
  // Nothing when closed already.
  void Close(absl::Time deadline);

  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<CompletionQueueThreads> queues;
  int port = 0;
};

// The most request messages one method served by ReadOnMatchMethod
// (async_call.h) reads at once on a queue. A small message is in gRPC's
// buffers when its call is matched, so its read ends at once: more reads
// would not serve small calls sooner, only let more large ones in.
inline constexpr int kMaxRequestReads = 4;

// How many request messages one method served by ReadOnMatchMethod may
// read at once on a queue: as many of the largest message as gRPC's memory
// quota holds, so that the messages being read do not bring gRPC to its
// quota (where it cuts calls: listener.cc), from 1 to kMaxRequestReads
// (kMaxRequestReads without a quota). 2 with knnd's defaults, where the
// largest message is half the quota.
int RequestReads(const ConnectionLimits& limits);

// Builds and starts the server; UNAVAILABLE "cannot listen on ROLE ADDRESS
// (address in use or invalid)" when it cannot bind.
absl::StatusOr<Listener> BuildListener(const ListenerSpec& spec);

}  // namespace knnd

#endif  // KNND_RPC_LISTENER_H_
