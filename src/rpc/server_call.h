// ServerCall: one unary call of knnd's API as the code that answers it sees
// it, whichever protocol carried it in: gRPC (async_call.h's UnaryCall) or
// HTTP/JSON (http_api.h's HttpCall). The handlers written against it
// (KnnServiceImpl's methods, the front of shards' Search) take the same
// steps for both front doors: the bearer token, the deadline, the gate,
// the answer's status; only the wire differs.
//
// Ownership: the protocol's code owns the call; a handler may use it until
// it has called Answer(), after which the call may be gone.
// Thread-safety: Answer() from any thread, once; the other methods from
// the thread that holds the call (cancelled() from any).
#ifndef KNND_RPC_SERVER_CALL_H_
#define KNND_RPC_SERVER_CALL_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "knnd/monitoring/metrics.h"

namespace knnd {

class TokenAuthenticator;

class ServerCallBase {
 public:
  // Which front door the call came through (the metrics' protocol label).
  virtual Metrics::Protocol protocol() const = 0;
  // The caller's address, for logs ("ipv4:127.0.0.1:40012").
  virtual std::string peer() const = 0;
  // When the caller stops waiting; absl::InfiniteFuture() (or later) when
  // it set no deadline.
  virtual absl::Time deadline() const = 0;
  // Whether the caller has gone (gRPC's cancellation). Safe on any thread.
  virtual bool cancelled() const = 0;
  // The caller's bearer token for `method` ("/knnd.v1.KnnService/Search"),
  // as `auth` decides (TokenAuthenticator::Check): the gRPC metadata or the
  // HTTP header "authorization", refused when it is given twice.
  virtual absl::Status Authorize(const TokenAuthenticator& auth,
                                 absl::string_view method) const = 0;
  // Metadata that goes with the answer: gRPC trailing metadata, HTTP
  // response headers (http_json.h names their HTTP forms).
  virtual void AddTrailer(const std::string& key, const std::string& value) = 0;
  // `on_cancel` runs once if the call is cancelled (never for a protocol
  // that cannot tell); `on_done` once the call is gone. Each at most once,
  // before Answer().
  virtual void OnCancel(std::function<void()> on_cancel) = 0;
  virtual void OnDone(std::function<void()> on_done) = 0;
  // Sends `status`, and the response when it is OK. Exactly once, from any
  // thread; the call may be gone when it returns.
  virtual void Answer(const absl::Status& status) = 0;

 protected:
  ~ServerCallBase() = default;
};

template <class Request, class Response>
class ServerCall : public ServerCallBase {
 public:
  virtual const Request& request() const = 0;
  virtual Response* response() = 0;

 protected:
  ~ServerCall() = default;
};

}  // namespace knnd

#endif  // KNND_RPC_SERVER_CALL_H_
