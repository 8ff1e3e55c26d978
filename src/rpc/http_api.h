// HttpApi: knnd's HTTP/JSON API (docs/api.md, "HTTP/JSON") over the HTTP
// listener (http_server.h): a table of routes, each a method set and a
// path mapped to a protocol-neutral handler, the same one gRPC calls
// (KnnServiceImpl's or the front of shards' methods, which take a
// ServerCall). An HttpCall reads the request from the body's JSON,
// carries the deadline header and the Authorization header to the
// handler, and turns its answer into JSON and an HTTP status
// (http_json.h). So every route goes through the same token check,
// admission, gate, memory model, deadline and statuses as gRPC's.
//
// Adding a unary method of the service is one entry in KnnRoutes() (as
// "/v1/get" is), and, if its answer holds JSON in a bytes field, a
// ResponseJson() overload for the answer's type (http_json.h:
// SearchResponse's payloads, GetResponse's records).
//
// Thread-safety: the routes are read-only once built; an HttpCall is
// answered once, from any thread.
#ifndef KNND_RPC_HTTP_API_H_
#define KNND_RPC_HTTP_API_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/health_service.h"
#include "knnd/rpc/http_json.h"
#include "knnd/rpc/http_server.h"
#include "knnd/rpc/server_call.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// One route: the methods it answers and what serves it.
struct HttpRoute {
  std::vector<std::string> methods;  // "GET", "POST"
  std::string path;                  // "/v1/search"
  // Whether a client without the certificate that mutual TLS requires is
  // still served (health, as grpc.health is served without a token).
  bool open_without_client_cert = false;
  std::function<void(std::shared_ptr<HttpExchange>)> serve;
};

// The answer to a call: the message's JSON (render) for OK, else the error
// JSON with the status's HTTP status; the trailers as headers.
HttpResponse HttpAnswer(
    const absl::Status& status,
    const std::vector<std::pair<std::string, std::string>>& trailers,
    const std::function<absl::Status(std::string*)>& render);

// Answers `exchange` with `status` as an error (status ok: 500).
void RespondError(HttpExchange& exchange, const absl::Status& status);

// A token check of an HTTP request, as TokenAuthenticator::CheckCall does
// for gRPC metadata: the Authorization header (refused when given twice).
absl::Status AuthorizeHttp(const HttpExchange& exchange,
                           const TokenAuthenticator& auth,
                           absl::string_view method);

// One unary call carried by HTTP/JSON: the request parsed from the body,
// the deadline from kTimeoutHeader, answered as JSON. Owns itself: deleted
// by Answer(), after which the handler's OnDone callback runs. The
// connection is not watched while the call waits for its answer, so it is
// never cancelled (its deadline still ends it).
template <class Request, class Response>
class HttpCall final : public ServerCall<Request, Response> {
 public:
  // The call for `exchange`, or null when its deadline header or body is
  // refused (then answered here).
  static HttpCall* Make(std::shared_ptr<HttpExchange> exchange) {
    absl::StatusOr<absl::Time> deadline =
        DeadlineOf(exchange->header(kTimeoutHeader), exchange->started());
    if (!deadline.ok()) {
      RespondError(*exchange, deadline.status());
      return nullptr;
    }
    auto* call = new HttpCall(std::move(exchange), *deadline);
    absl::Status parsed =
        ParseJsonRequest(call->exchange_->body(), &call->request_);
    call->exchange_->DropBody();
    if (!parsed.ok()) {
      RespondError(*call->exchange_, parsed);
      delete call;
      return nullptr;
    }
    return call;
  }

  Metrics::Protocol protocol() const override {
    return Metrics::Protocol::kHttp;
  }
  std::string peer() const override { return exchange_->peer(); }
  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return false; }
  absl::Status Authorize(const TokenAuthenticator& auth,
                         absl::string_view method) const override {
    return AuthorizeHttp(*exchange_, auth, method);
  }
  void AddTrailer(const std::string& key, const std::string& value) override {
    trailers_.emplace_back(key, value);
  }
  void OnCancel(std::function<void()> /*on_cancel*/) override {}
  void OnDone(std::function<void()> on_done) override {
    on_done_ = std::move(on_done);
  }
  void Answer(const absl::Status& status) override {
    exchange_->Respond(HttpAnswer(status, trailers_, [this](std::string* out) {
      return ResponseJson(&response_, out);
    }));
    std::function<void()> done = std::move(on_done_);
    delete this;
    if (done) done();
  }
  const Request& request() const override { return request_; }
  Response* response() override { return &response_; }

 private:
  HttpCall(std::shared_ptr<HttpExchange> exchange, absl::Time deadline)
      : exchange_(std::move(exchange)), deadline_(deadline) {}

  const std::shared_ptr<HttpExchange> exchange_;
  const absl::Time deadline_;
  Request request_;
  Response response_;
  std::vector<std::pair<std::string, std::string>> trailers_;
  std::function<void()> on_done_;
};

// A route whose requests are `Request` messages in JSON, handed to
// `handler` as ServerCalls.
template <class Request, class Response>
HttpRoute UnaryRoute(
    std::vector<std::string> methods, std::string path,
    std::function<void(ServerCall<Request, Response>*)> handler) {
  HttpRoute route;
  route.methods = std::move(methods);
  route.path = std::move(path);
  route.serve = [handler = std::move(handler)](
                    std::shared_ptr<HttpExchange> exchange) {
    if (auto* call = HttpCall<Request, Response>::Make(std::move(exchange))) {
      handler(call);
    }
  };
  return route;
}

// knnd.v1.KnnService's routes over `service` (a KnnServiceImpl or a
// ShardFront: anything with its methods over ServerCalls).
template <class Service>
std::vector<HttpRoute> KnnRoutes(Service* service) {
  using knnd::v1::GetIndexInfoRequest;
  using knnd::v1::GetIndexInfoResponse;
  using knnd::v1::GetRequest;
  using knnd::v1::GetResponse;
  using knnd::v1::SearchRequest;
  using knnd::v1::SearchResponse;
  return {
      UnaryRoute<SearchRequest, SearchResponse>(
          {"POST"}, "/v1/search",
          [service](ServerCall<SearchRequest, SearchResponse>* call) {
            service->Search(call);
          }),
      UnaryRoute<GetIndexInfoRequest, GetIndexInfoResponse>(
          {"GET", "POST"}, "/v1/index_info",
          [service](
              ServerCall<GetIndexInfoRequest, GetIndexInfoResponse>* call) {
            service->GetIndexInfo(call);
          }),
      UnaryRoute<GetRequest, GetResponse>(
          {"POST"}, "/v1/get",
          [service](ServerCall<GetRequest, GetResponse>* call) {
            service->Get(call);
          }),
  };
}

// GET /healthz/live (grpc.health's "") and /healthz/ready (`service`, the
// readiness Kubernetes' gRPC probes ask for): 200 {"status":"SERVING"}, else
// 503 with the status (NOT_SERVING) in the same form.
std::vector<HttpRoute> HealthRoutes(const HealthService* health,
                                    const std::string& service);

// The HttpServer handler over `routes`: the route of the request's path and
// method; 404 for an unknown path, 405 (with Allow) for a method the path
// does not take, 401 for a client whose certificate mutual TLS refused.
HttpHandler RouteRequests(std::vector<HttpRoute> routes);

// The server's own refusals (HttpServer::Options::refusal) as error JSON.
HttpResponse HttpRefusal(int http_status, const absl::Status& status);

}  // namespace knnd

#endif  // KNND_RPC_HTTP_API_H_
