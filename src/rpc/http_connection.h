// The per-connection and per-request side of HttpServer (http_server.h):
// what libmicrohttpd keeps for each connection and request, and its
// callbacks. Private to http_server.cc and http_connection.cc, the files
// that include libmicrohttpd.
//
// Thread-safety: a connection's callbacks run on the listener thread that
// serves it; HttpExchange::State is shared with the handler's threads
// under its mutex.
#ifndef KNND_RPC_HTTP_CONNECTION_H_
#define KNND_RPC_HTTP_CONNECTION_H_

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>

#include <cstdarg>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knnd/rpc/http_server.h"

namespace knnd {

// What an exchange shares with the connection that carries it.
struct HttpExchange::State {
  absl::Mutex mu;
  // Null until the exchange is dispatched; it answers through the server.
  HttpServer* server ABSL_GUARDED_BY(mu) = nullptr;
  MHD_Connection* connection = nullptr;  // set before dispatch
  HttpServer* quota_owner = nullptr;     // whose quota the body holds
  bool suspended ABSL_GUARDED_BY(mu) = false;
  bool answered ABSL_GUARDED_BY(mu) = false;
  HttpResponse response ABSL_GUARDED_BY(mu);
};

// One connection (libmicrohttpd's socket context).
struct HttpServer::Connection {
  HttpServer* server = nullptr;
  int fd = -1;
  absl::Time opened;
  // The watchdog shuts the socket down past it (under the server's mu_).
  absl::Time deadline;
  bool shut = false;
  // The TLS client certificate's verdict, once per connection (listener
  // thread only): unknown, accepted, refused.
  enum class Client { kUnknown, kVerified, kRefused } client = Client::kUnknown;
  std::string client_error;
};

// One request (libmicrohttpd's request context), from its request line.
struct HttpServer::Request {
  Connection* connection = nullptr;
  absl::Time started;
  bool headers_seen = false;
  bool dispatched = false;
  int64_t declared = -1;  // Content-Length; -1: none (chunked)
  // A refusal decided while the body arrives (chunked), answered once it
  // has: the HTTP status (0: none) and why.
  int refusal = 0;
  absl::Status refused;
  std::shared_ptr<HttpExchange::State> state;
  std::shared_ptr<HttpExchange> exchange;
  // The answer's bytes, charged to the memory quota until it is sent.
  int64_t answer_quota = 0;
};

// libmicrohttpd's callbacks, on the listener threads (the server is each
// one's closure).
struct HttpServer::Callbacks {
  using Options = HttpServer::Options;
  static void OnConnection(void* cls, MHD_Connection* c, void** context,
                           MHD_ConnectionNotificationCode code);

  static void* OnRequestLine(void* cls, const char* /*uri*/, MHD_Connection* c);

  static void OnCompleted(void* cls, MHD_Connection* /*c*/, void** context,
                          MHD_RequestTerminationCode /*code*/);

  static MHD_Result OnAccess(void* cls, MHD_Connection* c, const char* url,
                             const char* method, const char* /*version*/,
                             const char* upload_data, size_t* upload_size,
                             void** context);

  static MHD_Result CollectHeader(void* cls, MHD_ValueKind /*kind*/,
                                  const char* key, const char* value);

  // The headers are in: the exchange made, the body's length checked
  // against the limit and the quota before any of it is read.
  static MHD_Result Begin(HttpServer* server, MHD_Connection* c,
                          const char* url, const char* method,
                          Request* request);

  // With mutual TLS, the client's certificate, once per connection.
  static void VerifyClient(HttpServer* server, MHD_Connection* c,
                           Request* request);

  // A piece of the body. A chunked body is counted against the limit and
  // the quota as it arrives; past either, the rest is dropped and the
  // request answered once it has arrived.
  static void Receive(HttpServer* server, Request* request, const char* data,
                      size_t size);

  // The body is in: the handler gets the exchange; unless it answers at
  // once, the connection is suspended until it does.
  static MHD_Result Dispatch(HttpServer* server, MHD_Connection* c,
                             Request* request);

  // The handler's answer, once it is there.
  static MHD_Result QueueAnswer(HttpServer* server, MHD_Connection* c,
                                Request* request);

  // The server's own refusal; `close`: before the body was read (the
  // connection cannot go on).
  static MHD_Result Refuse(HttpServer* server, MHD_Connection* c,
                           int http_status, const absl::Status& status,
                           bool close);

  static MHD_Result Send(HttpServer* server, MHD_Connection* c,
                         HttpResponse response, bool close);

  static absl::Status BodyTooLarge(uint64_t bytes, const Options& options);

  static absl::Status QuotaFull(const Options& options);

  static void Log(void* cls, const char* format, va_list args);

  // gnutls_certificate_retrieve_function2: the identity in force. The
  // session's pointer is its connection (the library sets it), whose
  // socket context is set before the handshake.
  static int RetrieveCertificate(
      gnutls_session_t session, const gnutls_datum_t* /*req_ca_rdn*/,
      int /*nreqs*/, const gnutls_pk_algorithm_t* /*pk_algos*/,
      int /*pk_algos_length*/, gnutls_pcert_st** pcert,
      unsigned int* pcert_length, gnutls_privkey_t* key);
};

}  // namespace knnd

#endif  // KNND_RPC_HTTP_CONNECTION_H_
