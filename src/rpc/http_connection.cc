#include "knnd/rpc/http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/rpc/http_tls.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

void* SocketContext(MHD_Connection* c) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info == nullptr ? nullptr : info->socket_context;
}

void LogFromLibrary(void* /*cls*/, const char* format, va_list args) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  std::string text(line);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  spdlog::debug("http: {}", text);
}

}  // namespace

HttpExchange::HttpExchange(std::shared_ptr<State> state)
    : state_(std::move(state)) {}

void HttpExchange::DropBody() {
  std::string().swap(body_);
  if (body_quota_ > 0) state_->quota_owner->Release(body_quota_);
  body_quota_ = 0;
}

absl::optional<absl::string_view> HttpExchange::header(absl::string_view name,
                                                       int* count) const {
  absl::optional<absl::string_view> value;
  int seen = 0;
  for (const auto& [key, v] : headers_) {
    if (!absl::EqualsIgnoreCase(key, name)) continue;
    if (seen++ == 0) value = v;
  }
  if (count != nullptr) *count = seen;
  return value;
}

std::string HttpExchange::peer() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (peer_.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer_);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return absl::StrCat("ipv4:", host, ":", ntohs(a->sin_port));
  }
  if (peer_.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer_);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return absl::StrCat("ipv6:[", host, "]:", ntohs(a->sin6_port));
  }
  return "unknown";
}

bool HttpExchange::client_verified(std::string* why) const {
  if (!client_verified_ && why != nullptr) *why = client_error_;
  return client_verified_;
}

void HttpExchange::Respond(HttpResponse response) {
  HttpServer* server = nullptr;
  MHD_Connection* resume = nullptr;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->answered) return;
    state_->answered = true;
    state_->response = std::move(response);
    server = state_->server;
    if (state_->suspended) resume = state_->connection;
  }
  // Resumed before the server forgets it: Close() stops the daemon only
  // once every pending exchange is answered, and never with one suspended.
  if (resume != nullptr) MHD_resume_connection(resume);
  if (server != nullptr) {
    absl::MutexLock lock(&server->mu_);
    server->pending_.erase(
        std::remove(server->pending_.begin(), server->pending_.end(), state_),
        server->pending_.end());
  }
}

void HttpServer::Callbacks::OnConnection(void* cls, MHD_Connection* c,
                                         void** context,
                                         MHD_ConnectionNotificationCode code) {
  auto* server = static_cast<HttpServer*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* connection = new Connection;
    connection->server = server;
    const MHD_ConnectionInfo* fd =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    connection->fd = fd == nullptr ? -1 : fd->connect_fd;
    connection->opened = absl::Now();
    connection->deadline = connection->opened + server->options_.read_timeout;
    *context = connection;
    absl::MutexLock lock(&server->mu_);
    server->connections_.push_back(connection);
    return;
  }
  auto* connection = static_cast<Connection*>(*context);
  if (connection == nullptr) return;
  {
    // Before the library closes the socket: the watchdog never shuts
    // down a descriptor that another connection may have been given.
    absl::MutexLock lock(&server->mu_);
    auto& all = server->connections_;
    all.erase(std::remove(all.begin(), all.end(), connection), all.end());
  }
  delete connection;
  *context = nullptr;
}

void* HttpServer::Callbacks::OnRequestLine(void* cls, const char* /*uri*/,
                                           MHD_Connection* c) {
  auto* server = static_cast<HttpServer*>(cls);
  auto* request = new Request;
  request->connection = static_cast<Connection*>(SocketContext(c));
  request->started = absl::Now();
  if (request->connection != nullptr) {
    server->SetDeadline(request->connection,
                        request->started + server->options_.read_timeout);
  }
  return request;
}

void HttpServer::Callbacks::OnCompleted(void* cls, MHD_Connection* /*c*/,
                                        void** context,
                                        MHD_RequestTerminationCode /*code*/) {
  auto* server = static_cast<HttpServer*>(cls);
  auto* request = static_cast<Request*>(*context);
  if (request == nullptr) return;
  if (request->exchange != nullptr) request->exchange->DropBody();
  server->Release(request->answer_quota);
  if (request->connection != nullptr) {
    server->SetDeadline(request->connection,
                        absl::Now() + server->options_.idle_timeout);
  }
  delete request;
  *context = nullptr;
}

MHD_Result HttpServer::Callbacks::OnAccess(void* cls, MHD_Connection* c,
                                           const char* url, const char* method,
                                           const char* /*version*/,
                                           const char* upload_data,
                                           size_t* upload_size,
                                           void** context) {
  auto* server = static_cast<HttpServer*>(cls);
  auto* request = static_cast<Request*>(*context);
  if (request == nullptr) return MHD_NO;
  if (!request->headers_seen) {
    request->headers_seen = true;
    return Begin(server, c, url, method, request);
  }
  if (*upload_size > 0) {
    Receive(server, request, upload_data, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (!request->dispatched) return Dispatch(server, c, request);
  return QueueAnswer(server, c, request);
}

MHD_Result HttpServer::Callbacks::CollectHeader(void* cls,
                                                MHD_ValueKind /*kind*/,
                                                const char* key,
                                                const char* value) {
  static_cast<std::vector<std::pair<std::string, std::string>>*>(cls)
      ->emplace_back(key, value == nullptr ? "" : value);
  return MHD_YES;
}

// The headers are in: the exchange made, the body's length checked
// against the limit and the quota before any of it is read.
MHD_Result HttpServer::Callbacks::Begin(HttpServer* server, MHD_Connection* c,
                                        const char* url, const char* method,
                                        Request* request) {
  request->state = std::make_shared<HttpExchange::State>();
  request->state->connection = c;
  request->state->quota_owner = server;
  request->exchange.reset(new HttpExchange(request->state));
  HttpExchange& exchange = *request->exchange;
  exchange.method_ = method;
  exchange.path_ = url;
  exchange.started_ = request->started;
  MHD_get_connection_values(c, MHD_HEADER_KIND, &CollectHeader,
                            &exchange.headers_);
  if (const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
      info != nullptr && info->client_addr != nullptr) {
    std::memcpy(&exchange.peer_, info->client_addr,
                info->client_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                         : sizeof(sockaddr_in));
  }
  VerifyClient(server, c, request);
  const absl::optional<absl::string_view> length =
      exchange.header("Content-Length");
  if (!length.has_value()) return MHD_YES;  // none, or chunked
  const Options& options = server->options_;
  uint64_t declared = 0;
  if (!absl::SimpleAtoi(*length, &declared))
    return MHD_YES;  // the library's 400
  if (declared > static_cast<uint64_t>(options.max_body_bytes)) {
    return Refuse(server, c, 413, BodyTooLarge(declared, options),
                  /*close=*/true);
  }
  request->declared = static_cast<int64_t>(declared);
  if (!server->Reserve(request->declared)) {
    // Not at once: a client that sends its body before reading (most do,
    // without Expect: 100-continue) would meet a closed connection, not
    // the 429. The body, at most the limit, is dropped as it arrives.
    request->refusal = 429;
    request->refused = QuotaFull(options);
    return MHD_YES;
  }
  exchange.body_quota_ = request->declared;
  exchange.body_.reserve(declared);
  return MHD_YES;
}

// With mutual TLS, the client's certificate, once per connection.
void HttpServer::Callbacks::VerifyClient(HttpServer* server, MHD_Connection* c,
                                         Request* request) {
  HttpTls* tls = server->tls_.get();
  Connection* connection = request->connection;
  if (tls == nullptr || !tls->wants_client_cert() || connection == nullptr) {
    return;
  }
  if (connection->client == Connection::Client::kUnknown) {
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    absl::Status verdict = info == nullptr
                               ? absl::UnauthenticatedError("no TLS session")
                               : tls->VerifyClient(info->tls_session);
    // Without require_client_cert, a client without a certificate is
    // accepted; one presenting a bad certificate is not.
    if (!verdict.ok() && !tls->requires_client_cert() &&
        absl::StrContains(verdict.message(), "presented none")) {
      verdict = absl::OkStatus();
    }
    connection->client = verdict.ok() ? Connection::Client::kVerified
                                      : Connection::Client::kRefused;
    connection->client_error = std::string(verdict.message());
  }
  request->exchange->client_verified_ =
      connection->client == Connection::Client::kVerified;
  request->exchange->client_error_ = connection->client_error;
}

// A piece of the body. A chunked body is counted against the limit and
// the quota as it arrives; past either, the rest is dropped and the
// request answered once it has arrived.
void HttpServer::Callbacks::Receive(HttpServer* server, Request* request,
                                    const char* data, size_t size) {
  HttpExchange& exchange = *request->exchange;
  if (request->refusal != 0) return;
  if (request->declared < 0) {
    const Options& options = server->options_;
    const uint64_t total = exchange.body_.size() + size;
    int refusal = 0;
    absl::Status why;
    if (total > static_cast<uint64_t>(options.max_body_bytes)) {
      refusal = 413;
      why = BodyTooLarge(total, options);
    } else if (!server->Reserve(static_cast<int64_t>(size))) {
      refusal = 429;
      why = QuotaFull(options);
    }
    if (refusal != 0) {
      request->refusal = refusal;
      request->refused = why;
      exchange.DropBody();
      return;
    }
    exchange.body_quota_ += static_cast<int64_t>(size);
  }
  exchange.body_.append(data, size);
}

// The body is in: the handler gets the exchange; unless it answers at
// once, the connection is suspended until it does.
MHD_Result HttpServer::Callbacks::Dispatch(HttpServer* server,
                                           MHD_Connection* c,
                                           Request* request) {
  if (request->refusal != 0) {
    return Refuse(server, c, request->refusal, request->refused,
                  /*close=*/false);
  }
  request->dispatched = true;
  if (request->connection != nullptr) {
    server->SetDeadline(request->connection, absl::InfiniteFuture());
  }
  HttpExchange::State& state = *request->state;
  request->exchange->arrival_ = absl::Now();
  {
    absl::MutexLock lock(&state.mu);
    state.server = server;
  }
  {
    absl::MutexLock lock(&server->mu_);
    server->pending_.push_back(request->state);
  }
  server->handler_(request->exchange);
  {
    absl::MutexLock lock(&state.mu);
    if (!state.answered) {
      state.suspended = true;
      MHD_suspend_connection(c);
      return MHD_YES;
    }
  }
  return QueueAnswer(server, c, request);
}

// The handler's answer, once it is there.
MHD_Result HttpServer::Callbacks::QueueAnswer(HttpServer* server,
                                              MHD_Connection* c,
                                              Request* request) {
  HttpResponse response;
  {
    HttpExchange::State& state = *request->state;
    absl::MutexLock lock(&state.mu);
    if (!state.answered) {  // not resumed by an answer: wait on
      state.suspended = true;
      MHD_suspend_connection(c);
      return MHD_YES;
    }
    state.suspended = false;
    response = std::move(state.response);
  }
  const bool close =
      request->connection != nullptr &&
      server->options_.max_connection_age > absl::ZeroDuration() &&
      absl::Now() - request->connection->opened >
          server->options_.max_connection_age;
  // Answers are not refused (they are made), but while they wait to be
  // sent their bytes keep new bodies out.
  request->answer_quota = static_cast<int64_t>(response.body.size());
  server->Charge(request->answer_quota);
  return Send(server, c, std::move(response), close);
}

MHD_Result HttpServer::Callbacks::Refuse(HttpServer* server, MHD_Connection* c,
                                         int http_status,
                                         const absl::Status& status,
                                         bool close) {
  HttpResponse response = server->options_.refusal(http_status, status);
  if (http_status == 429) response.headers.emplace_back("Retry-After", "1");
  return Send(server, c, std::move(response), close);
}

MHD_Result HttpServer::Callbacks::Send(HttpServer* server, MHD_Connection* c,
                                       HttpResponse response, bool close) {
  auto* body = new std::string(std::move(response.body));
  MHD_Response* out = MHD_create_response_from_buffer_with_free_callback_cls(
      body->size(), body->data(),
      [](void* owned) { delete static_cast<std::string*>(owned); }, body);
  MHD_add_response_header(out, MHD_HTTP_HEADER_CONTENT_TYPE,
                          response.content_type.c_str());
  for (const auto& [name, value] : response.headers) {
    MHD_add_response_header(out, name.c_str(), value.c_str());
  }
  if (close || server->closing_.load(std::memory_order_relaxed)) {
    MHD_add_response_header(out, MHD_HTTP_HEADER_CONNECTION, "close");
  }
  const MHD_Result queued =
      MHD_queue_response(c, static_cast<unsigned>(response.status), out);
  MHD_destroy_response(out);
  return queued;
}

absl::Status HttpServer::Callbacks::BodyTooLarge(uint64_t bytes,
                                                 const Options& options) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the request body of ", bytes,
      " bytes exceeds http_max_body_bytes=", options.max_body_bytes,
      "; send fewer queries per request, or vectors as base64 "
      "(vectors_f32le), or use gRPC"));
}

absl::Status HttpServer::Callbacks::QuotaFull(const Options& options) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the HTTP request bodies being received fill "
                   "http_memory_quota_bytes=",
                   options.memory_quota_bytes, "; retry after Retry-After"));
}

void HttpServer::Callbacks::Log(void* cls, const char* format, va_list args) {
  LogFromLibrary(cls, format, args);
}

// gnutls_certificate_retrieve_function2: the identity in force. The
// session's pointer is its connection (the library sets it), whose
// socket context is set before the handshake.
int HttpServer::Callbacks::RetrieveCertificate(
    gnutls_session_t session, const gnutls_datum_t* /*req_ca_rdn*/,
    int /*nreqs*/, const gnutls_pk_algorithm_t* /*pk_algos*/,
    int /*pk_algos_length*/, gnutls_pcert_st** pcert,
    unsigned int* pcert_length, gnutls_privkey_t* key) {
  auto* c = static_cast<MHD_Connection*>(gnutls_session_get_ptr(session));
  auto* connection =
      c == nullptr ? nullptr : static_cast<Connection*>(SocketContext(c));
  if (connection == nullptr || connection->server->tls_ == nullptr) {
    return -1;
  }
  void* certs = nullptr;
  void* private_key = nullptr;
  connection->server->tls_->CurrentIdentity(&certs, pcert_length, &private_key);
  *pcert = static_cast<gnutls_pcert_st*>(certs);
  *key = static_cast<gnutls_privkey_t>(private_key);
  return 0;
}

}  // namespace knnd
