#include "knnd/rpc/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/base/range_check.h"
#include "knnd/rpc/http_connection.h"
#include "knnd/serving/worker_pool.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

// How often the watchdog looks for connections past their deadline (and
// whether the TLS files are due for a re-read): deadlines hold to within
// this.
constexpr absl::Duration kWatchTick = absl::Milliseconds(250);
// Close(): how long answers forced at the deadline get to go out before
// the connections are closed.
constexpr absl::Duration kForcedAnswerTime = absl::Milliseconds(100);
constexpr char kShuttingDown[] = "knnd is shutting down";

MHD_Daemon* AsDaemon(void* d) { return static_cast<MHD_Daemon*>(d); }

// "host:port", "[v6]:port" or ":port" (any address) to a socket address.
absl::StatusOr<sockaddr_storage> Resolve(const std::string& address,
                                         const std::string& role) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port =
      colon == std::string::npos ? "" : address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 ||
      port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        role, " ", address, " is not host:port (a port 0 to 65535)"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                  &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", role, " ",
                                               address,
                                               " (address in use or invalid)"));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr,
              std::min<size_t>(found->ai_addrlen, sizeof(out)));
  freeaddrinfo(found);
  return out;
}

}  // namespace
HttpServer::HttpServer(const Options& options, HttpHandler handler)
    : options_(options), handler_(std::move(handler)) {}

absl::Status HttpServer::ValidateOptions(const Options& o) {
  const absl::Duration hour = absl::Hours(1);
  for (absl::Status s :
       {CheckInRange("http_threads", o.threads, 0, 256),
        CheckInRange("http_max_connections", o.max_connections, 1, 1000000),
        CheckInRange("http_max_connections_per_ip", o.max_connections_per_ip, 0,
                     1000000),
        CheckInRange("http_max_body_bytes", o.max_body_bytes, int64_t{1024},
                     o.memory_quota_bytes),
        CheckInRange("http_read_timeout_ms",
                     absl::ToInt64Milliseconds(o.read_timeout), int64_t{1000},
                     absl::ToInt64Milliseconds(hour)),
        CheckInRange("http_idle_timeout_ms",
                     absl::ToInt64Milliseconds(o.idle_timeout), int64_t{1000},
                     absl::ToInt64Milliseconds(hour))}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const Options& options, HttpHandler handler) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  absl::StatusOr<sockaddr_storage> address =
      Resolve(options.address, options.role);
  if (!address.ok()) return address.status();
  std::unique_ptr<HttpServer> server(
      new HttpServer(options, std::move(handler)));
  if (!server->options_.refusal) {
    server->options_.refusal = [](int http_status, const absl::Status& s) {
      HttpResponse response;
      response.status = http_status;
      response.content_type = "text/plain";
      response.body = std::string(s.message());
      return response;
    };
  }
  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  if (address->ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  std::vector<MHD_OptionItem> items;
  auto add = [&items](MHD_OPTION option, intptr_t value, void* ptr) {
    items.push_back(MHD_OptionItem{option, value, ptr});
  };
  HttpServer* s = server.get();
  add(MHD_OPTION_SOCK_ADDR, 0, &*address);
  add(MHD_OPTION_CONNECTION_LIMIT, options.max_connections, nullptr);
  if (options.max_connections_per_ip > 0) {
    add(MHD_OPTION_PER_IP_CONNECTION_LIMIT, options.max_connections_per_ip,
        nullptr);
  }
  // The library's own timeout is one of inactivity (a byte resets it): it
  // bounds a kept-alive connection and an answer the client does not read;
  // the watchdog bounds the time a request takes to arrive.
  add(MHD_OPTION_CONNECTION_TIMEOUT,
      std::max<int64_t>(1, absl::ToInt64Seconds(options.idle_timeout +
                                                absl::Milliseconds(999))),
      nullptr);
  add(MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      std::max(32 << 10, 2 * options.max_header_bytes + (16 << 10)), nullptr);
  const int threads = options.threads > 0 ? options.threads : AvailableCores();
  if (threads > 1) add(MHD_OPTION_THREAD_POOL_SIZE, threads, nullptr);
  add(MHD_OPTION_NOTIFY_CONNECTION,
      reinterpret_cast<intptr_t>(&Callbacks::OnConnection), s);
  add(MHD_OPTION_URI_LOG_CALLBACK,
      reinterpret_cast<intptr_t>(&Callbacks::OnRequestLine), s);
  add(MHD_OPTION_NOTIFY_COMPLETED,
      reinterpret_cast<intptr_t>(&Callbacks::OnCompleted), s);
  add(MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&Callbacks::Log),
      nullptr);
  if (!options.tls.cert_file.empty()) {
    absl::StatusOr<std::unique_ptr<HttpTls>> tls = HttpTls::Create(options.tls);
    if (!tls.ok()) return tls.status();
    server->tls_ = std::move(*tls);
    flags |= MHD_USE_TLS;
    add(MHD_OPTION_HTTPS_CERT_CALLBACK, 0,
        reinterpret_cast<void*>(&Callbacks::RetrieveCertificate));
    if (server->tls_->wants_client_cert()) {
      add(MHD_OPTION_HTTPS_MEM_TRUST, 0,
          const_cast<char*>(server->tls_->first_client_ca_pem().c_str()));
    }
  }
  add(MHD_OPTION_END, 0, nullptr);
  const uint16_t port =
      address->ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&*address)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&*address)->sin_port);
  server->daemon_ =
      MHD_start_daemon(flags, port, nullptr, nullptr, &Callbacks::OnAccess, s,
                       MHD_OPTION_ARRAY, items.data(), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.role, " ", options.address,
                     " (address in use or invalid)"));
  }
  const MHD_DaemonInfo* bound =
      MHD_get_daemon_info(AsDaemon(server->daemon_), MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = bound == nullptr ? port : bound->port;
  server->watchdog_ = std::thread([s] { s->Watch(); });
  return server;
}

HttpServer::~HttpServer() { Close(absl::InfinitePast()); }

int HttpServer::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pending_.size());
}

void HttpServer::Close(absl::Time deadline) {
  if (daemon_ == nullptr) return;
  SetClosing();
  const MHD_socket listen = MHD_quiesce_daemon(AsDaemon(daemon_));
  if (listen != MHD_INVALID_SOCKET) close(listen);
  {
    absl::MutexLock lock(&mu_);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return pending_.empty();
    };
    mu_.AwaitWithDeadline(absl::Condition(&answered), deadline);
  }
  std::vector<std::shared_ptr<HttpExchange::State>> left;
  {
    absl::MutexLock lock(&mu_);
    left = pending_;
  }
  if (!left.empty()) {
    spdlog::warn(
        "HTTP listener closing with {} requests unanswered: "
        "answered 503 UNAVAILABLE",
        left.size());
    for (const auto& state : left) {
      HttpExchange forced(state);
      forced.Respond(
          options_.refusal(503, absl::UnavailableError(kShuttingDown)));
    }
    absl::SleepFor(kForcedAnswerTime);
  }
  stop_watch_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
  MHD_stop_daemon(AsDaemon(daemon_));
  daemon_ = nullptr;
}

void HttpServer::SetDeadline(Connection* connection, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  connection->deadline = deadline;
}

void HttpServer::Watch() {
  while (!stop_watch_.WaitForNotificationWithTimeout(kWatchTick)) {
    const absl::Time now = absl::Now();
    if (tls_ != nullptr) tls_->MaybeReload(now);
    absl::MutexLock lock(&mu_);
    for (Connection* connection : connections_) {
      if (connection->shut || connection->deadline > now ||
          connection->fd < 0) {
        continue;
      }
      // The library sees the connection end and closes it on its thread.
      shutdown(connection->fd, SHUT_RDWR);
      connection->shut = true;
    }
  }
}

bool HttpServer::Reserve(int64_t bytes) {
  int64_t held = reserved_bytes_.load(std::memory_order_relaxed);
  do {
    if (held + bytes > options_.memory_quota_bytes) return false;
  } while (!reserved_bytes_.compare_exchange_weak(held, held + bytes,
                                                  std::memory_order_relaxed));
  return true;
}

void HttpServer::Charge(int64_t bytes) {
  reserved_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void HttpServer::Release(int64_t bytes) {
  reserved_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace knnd
