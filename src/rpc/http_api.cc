#include "knnd/rpc/http_api.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.pb.h"

namespace knnd {
namespace {

using grpc::health::v1::HealthCheckResponse;

HttpResponse ErrorResponse(int http_status, const absl::Status& status) {
  HttpResponse response;
  response.status = http_status;
  response.body = ErrorJson(status);
  return response;
}

// "POST /v1/search, GET|POST /v1/index_info, ...": what a 404 lists.
std::string Describe(const std::vector<HttpRoute>& routes) {
  std::vector<std::string> parts;
  for (const HttpRoute& route : routes) {
    parts.push_back(
        absl::StrCat(absl::StrJoin(route.methods, "|"), " ", route.path));
  }
  return absl::StrJoin(parts, ", ");
}

HttpRoute HealthRoute(const HealthService* health, std::string path,
                      std::string service) {
  HttpRoute route;
  route.methods = {"GET"};
  route.path = std::move(path);
  route.open_without_client_cert = true;
  route.serve = [health, service = std::move(service)](
                    std::shared_ptr<HttpExchange> exchange) {
    HealthCheckResponse answer;
    answer.set_status(health->StatusOf(service));
    HttpResponse response;
    response.status =
        answer.status() == HealthCheckResponse::SERVING ? 200 : 503;
    if (absl::Status s = ResponseJson(&answer, &response.body); !s.ok()) {
      return RespondError(*exchange, s);
    }
    exchange->Respond(std::move(response));
  };
  return route;
}

}  // namespace

HttpResponse HttpAnswer(
    const absl::Status& status,
    const std::vector<std::pair<std::string, std::string>>& trailers,
    const std::function<absl::Status(std::string*)>& render) {
  HttpResponse response;
  if (status.ok()) {
    if (absl::Status rendered = render(&response.body); !rendered.ok()) {
      response = ErrorResponse(500, rendered);
    }
  } else {
    response = ErrorResponse(HttpStatusOf(status.code()), status);
  }
  response.headers = TrailerHeaders(trailers);
  return response;
}

void RespondError(HttpExchange& exchange, const absl::Status& status) {
  exchange.Respond(ErrorResponse(
      status.ok() ? 500 : HttpStatusOf(status.code()),
      status.ok() ? absl::InternalError("an error answer without an error")
                  : status));
}

absl::Status AuthorizeHttp(const HttpExchange& exchange,
                           const TokenAuthenticator& auth,
                           absl::string_view method) {
  int count = 0;
  const absl::optional<absl::string_view> authorization =
      exchange.header("Authorization", &count);
  if (count > 1) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: more than one entry");
  }
  return auth.Check(method, authorization);
}

std::vector<HttpRoute> HealthRoutes(const HealthService* health,
                                    const std::string& service) {
  return {HealthRoute(health, "/healthz/live", ""),
          HealthRoute(health, "/healthz/ready", service)};
}

HttpHandler RouteRequests(std::vector<HttpRoute> routes) {
  auto table =
      std::make_shared<const std::vector<HttpRoute>>(std::move(routes));
  return [table](std::shared_ptr<HttpExchange> exchange) {
    const HttpRoute* route = nullptr;
    for (const HttpRoute& r : *table) {
      if (r.path == exchange->path()) route = &r;
    }
    if (route == nullptr) {
      return RespondError(*exchange, absl::NotFoundError(absl::StrCat(
                                         "no route for ", exchange->method(),
                                         " ", exchange->path(),
                                         "; knnd serves ", Describe(*table))));
    }
    if (std::find(route->methods.begin(), route->methods.end(),
                  exchange->method()) == route->methods.end()) {
      HttpResponse response =
          ErrorResponse(405, absl::UnimplementedError(absl::StrCat(
                                 exchange->path(), " takes ",
                                 absl::StrJoin(route->methods, " or "),
                                 ", not ", exchange->method())));
      response.headers.emplace_back("Allow",
                                    absl::StrJoin(route->methods, ", "));
      return exchange->Respond(std::move(response));
    }
    std::string why;
    if (!route->open_without_client_cert && !exchange->client_verified(&why)) {
      return RespondError(*exchange, absl::UnauthenticatedError(why));
    }
    route->serve(std::move(exchange));
  };
}

HttpResponse HttpRefusal(int http_status, const absl::Status& status) {
  return ErrorResponse(http_status, status);
}

}  // namespace knnd
