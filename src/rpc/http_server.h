// HttpServer: knnd's HTTP/1.1 listener, over libmicrohttpd (only this
// file's .cc and http_connection.*, each connection's side, include it;
// GnuTLS only http_connection.* and http_tls.cc). It knows bytes, not
// knnd's API: a request whose body has arrived
// is handed to one handler (http_api.h routes it), which answers it now or
// later from any thread.
//
// Bounds, so that no client can hold a thread or unbounded memory
// (docs/architecture.md, "The HTTP listener"):
//   - `threads` event-driven threads (epoll), each serving many
//     connections; a connection waiting for its answer is suspended (off
//     the event loop) and the handler's answer resumes it, so no thread
//     waits for a search;
//   - at most `max_connections` connections (`max_connections_per_ip` per
//     client address); more wait in the kernel's backlog;
//   - a request's headers and body must arrive within `read_timeout` of
//     its request line (a new connection's first request: of the connect),
//     a kept-alive connection may idle `idle_timeout`: past either the
//     connection is closed (a watchdog thread shuts its socket down), so a
//     client sending a byte at a time holds a slot for a bounded time;
//   - a body longer than `max_body_bytes` is answered 413 before it is
//     read (a chunked one once it passes the limit; the rest is read and
//     dropped); the bodies being received and the answers being sent hold
//     at most `memory_quota_bytes` together, past which a request is
//     answered 429, its body dropped as it arrives, never held (an answer
//     is charged whatever the quota holds: it is made already);
//   - headers within a per-connection pool (`max_header_bytes`): larger
//     ones are answered 431 by the library.
// Keep-alive is HTTP/1.1's default; "Connection: close" is sent once
// SetClosing() is called (the drain: clients then reconnect elsewhere) and
// on a connection older than `max_connection_age`.
//
// Ownership: owns the daemon, its threads and the watchdog; an exchange is
// shared by the server and its handler until both are done with it.
// Thread-safety: Start()/Close() from one thread; SetClosing() and
// HttpExchange::Respond() from any.
#ifndef KNND_RPC_HTTP_SERVER_H_
#define KNND_RPC_HTTP_SERVER_H_

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "knnd/rpc/http_tls.h"

namespace knnd {

class HttpServer;

// The answer to one request.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// One request whose headers and body have arrived, and its answer.
class HttpExchange {
 public:
  const std::string& method() const { return method_; }
  // The path, without the query string.
  const std::string& path() const { return path_; }
  const std::string& body() const { return body_; }
  // Frees the body and gives its bytes back to the memory quota (once it
  // is parsed: an admitted request's own memory is the gate's to count).
  void DropBody();
  // The value of header `name` (case-insensitive); nullopt when absent.
  // `count` (optional) gets how many times it was given.
  absl::optional<absl::string_view> header(absl::string_view name,
                                           int* count = nullptr) const;
  // When the request line arrived (a deadline counts from it) and when the
  // body was complete (the request's arrival for metrics).
  absl::Time started() const { return started_; }
  absl::Time arrival() const { return arrival_; }
  // "ipv4:127.0.0.1:40012" or "ipv6:[::1]:40012".
  std::string peer() const;
  // With mutual TLS: whether the client presented a certificate that
  // verified against tls_client_ca_file (always true without it, and
  // without require_client_cert); `why` gets the reason when not.
  bool client_verified(std::string* why = nullptr) const;

  // Answers the request: at most once (later calls are dropped), from any
  // thread, before or after the handler returns.
  void Respond(HttpResponse response);

 private:
  friend class HttpServer;
  struct State;
  explicit HttpExchange(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::string method_;
  std::string path_;
  std::string body_;
  int64_t body_quota_ = 0;  // bytes of the memory quota the body holds
  std::vector<std::pair<std::string, std::string>> headers_;
  absl::Time started_;
  absl::Time arrival_;
  sockaddr_storage peer_{};
  bool client_verified_ = true;
  std::string client_error_;
};

// What the server calls for each complete request, on a listener thread: it
// must not block (it answers through exchange->Respond, now or later).
using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

class HttpServer {
 public:
  struct Options {
    std::string address;  // host:port; port 0 picks a free one
    // What errors call the address, e.g. "http_listen_address".
    std::string role = "http_listen_address";
    int threads = 0;  // 0: one per core available
    int max_connections = 1024;
    int max_connections_per_ip = 0;  // 0: no cap per address
    int64_t max_body_bytes = int64_t{16} << 20;
    int64_t memory_quota_bytes = int64_t{32} << 20;
    int max_header_bytes = 16384;
    absl::Duration read_timeout = absl::Seconds(10);
    absl::Duration idle_timeout = absl::Seconds(30);
    absl::Duration max_connection_age = absl::Minutes(5);  // 0: none
    // TLS from these PEM files when tls.cert_file is set (http_tls.h).
    HttpTls::Files tls;
    // The answer to a request the server refuses itself (413 body too
    // large, 429 quota full, 503 closing) with `status` saying why; unset:
    // the message as text/plain.
    std::function<HttpResponse(int http_status, const absl::Status& status)>
        refusal;
  };

  // The one range check of each option (the config check calls it):
  // threads 0-256, max_connections 1-1000000, max_body_bytes from 1024 to
  // memory_quota_bytes, timeouts from 1 s to an hour.
  static absl::Status ValidateOptions(const Options& options);

  // Binds the address and starts serving with `handler`. UNAVAILABLE
  // "cannot listen on ROLE ADDRESS ..." when it cannot bind;
  // FAILED_PRECONDITION naming the file when a TLS file does not load.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const Options& options, HttpHandler handler);
  ~HttpServer();  // Close(absl::InfinitePast())

  int port() const { return port_; }

  // From now on every answer carries "Connection: close".
  void SetClosing() { closing_.store(true, std::memory_order_relaxed); }
  // Stops accepting connections, waits until `deadline` for the requests
  // handed to the handler to be answered (answering those left 503
  // UNAVAILABLE "knnd is shutting down"), then closes every connection and
  // stops the threads. Idempotent.
  void Close(absl::Time deadline);

  // The requests handed to the handler and not yet answered.
  int pending() const;

 private:
  friend class HttpExchange;  // DropBody() and Respond() reach the quota
  struct Connection;
  struct Request;
  struct Callbacks;
  explicit HttpServer(const Options& options, HttpHandler handler);

  // A connection's deadline (watchdog), under mu_.
  void SetDeadline(Connection* connection, absl::Time deadline);
  // Closes the sockets of connections past their deadline until stopped.
  void Watch();
  // The memory quota: reserves `bytes` (false when it would pass it), or
  // charges them whatever it holds (an answer, made already).
  bool Reserve(int64_t bytes);
  void Charge(int64_t bytes);
  void Release(int64_t bytes);

  Options options_;  // refusal set by Start()
  const HttpHandler handler_;
  std::unique_ptr<HttpTls> tls_;
  void* daemon_ = nullptr;  // struct MHD_Daemon
  int port_ = 0;
  std::atomic<bool> closing_{false};
  std::atomic<int64_t> reserved_bytes_{0};

  mutable absl::Mutex mu_;
  std::vector<Connection*> connections_ ABSL_GUARDED_BY(mu_);
  // The exchanges handed to the handler and not yet answered.
  std::vector<std::shared_ptr<HttpExchange::State>> pending_
      ABSL_GUARDED_BY(mu_);
  absl::Notification stop_watch_;
  std::thread watchdog_;
};

}  // namespace knnd

#endif  // KNND_RPC_HTTP_SERVER_H_
