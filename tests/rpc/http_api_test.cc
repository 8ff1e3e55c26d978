// HttpApi's route table over a real HttpServer and a fake service (the
// handlers' own steps are knn_service_test's and the Python tests' against
// knnd): routing (404 listing the routes, 405 with Allow), the body read
// into the request or refused before the handler, the deadline and
// Authorization headers as the handler sees them, answers in JSON with
// their HTTP status and Retry-After, OnDone after the answer, and the
// health routes following HealthService.
#include "knnd/rpc/http_api.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/storage/json_value.h"
#include "testing/raw_http.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::RawHttp;
using ::knnd::v1::GetIndexInfoRequest;
using ::knnd::v1::GetIndexInfoResponse;
using ::knnd::v1::SearchRequest;
using ::knnd::v1::SearchResponse;
using ::testing::HasSubstr;

constexpr char kToken[] = "search-token-0123456789";

// Stands for KnnServiceImpl: checks the token as it does, then answers by
// the request's k: 1 OK (with a payload), 2 a full gate's refusal, 3 OK
// from another thread later.
class FakeService {
 public:
  explicit FakeService(const TokenAuthenticator* auth) : auth_(auth) {}
  ~FakeService() {
    for (std::thread& t : threads_) t.join();
  }

  void Search(ServerCall<SearchRequest, SearchResponse>* call) {
    {
      absl::MutexLock lock(&mu_);
      deadline_ = call->deadline();
      calls_++;
    }
    call->OnDone([this] {
      absl::MutexLock lock(&mu_);
      done_++;
    });
    if (absl::Status s = call->Authorize(*auth_, kSearchMethod); !s.ok()) {
      return call->Answer(s);
    }
    switch (call->request().k()) {
      case 1:
        call->response()->add_ids(int64_t{1} << 40);
        call->response()->add_distances(0.25f);
        call->response()->add_payloads(R"({"text":"a"})");
        return call->Answer(absl::OkStatus());
      case 2:
        call->AddTrailer(kPushbackMetadata, "50");
        return call->Answer(absl::ResourceExhaustedError("gate full"));
      default:
        threads_.emplace_back([call] {
          absl::SleepFor(absl::Milliseconds(20));
          call->response()->set_k(3);
          call->Answer(absl::OkStatus());
        });
    }
  }
  void GetIndexInfo(
      ServerCall<GetIndexInfoRequest, GetIndexInfoResponse>* call) {
    call->response()->set_dim(48);
    call->Answer(absl::OkStatus());
  }
  // One record per id, its payload {"n":id}.
  void Get(ServerCall<knnd::v1::GetRequest, knnd::v1::GetResponse>* call) {
    for (int64_t id : call->request().ids()) {
      knnd::v1::Record* record = call->response()->add_records();
      record->set_id(id);
      record->set_payload(absl::StrCat("{\"n\":", id, "}"));
    }
    call->Answer(absl::OkStatus());
  }

  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::Time deadline() {
    absl::MutexLock lock(&mu_);
    return deadline_;
  }

 private:
  const TokenAuthenticator* const auth_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int calls_ = 0;
  int done_ = 0;
  absl::Time deadline_;
};

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    knnd::testing::WriteFile(tmp_.path("tokens"), absl::StrCat(kToken, "\n"));
    TokenAuthenticator::Options auth;
    auth.search_token_file = tmp_.path("tokens");
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> made =
        TokenAuthenticator::Create(auth);
    ASSERT_TRUE(made.ok()) << made.status();
    auth_ = std::move(*made);
    service_ = std::make_unique<FakeService>(auth_.get());
    std::vector<HttpRoute> routes = KnnRoutes(service_.get());
    for (HttpRoute& r : HealthRoutes(&health_, "knnd.v1.KnnService")) {
      routes.push_back(std::move(r));
    }
    HttpServer::Options options;
    options.address = "127.0.0.1:0";
    options.threads = 1;
    options.refusal = HttpRefusal;
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(options, RouteRequests(std::move(routes)));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  RawHttp::Response Call(const std::string& request) {
    RawHttp client(server_->port());
    EXPECT_TRUE(client.Send(request));
    absl::optional<RawHttp::Response> r = client.Read();
    EXPECT_TRUE(r.has_value());
    return r.value_or(RawHttp::Response());
  }
  RawHttp::Response Search(const std::string& body,
                           const std::string& headers = "") {
    return Call(RawHttp::Request(
        "POST", "/v1/search", body,
        absl::StrCat("Authorization: Bearer ", kToken, "\r\n", headers)));
  }
  static JsonValue Json(const RawHttp::Response& r) {
    absl::StatusOr<JsonValue> parsed = ParseJson(r.body);
    EXPECT_TRUE(parsed.ok()) << r.body;
    return parsed.value_or(JsonValue());
  }

  knnd::testing::TempDir tmp_;
  std::unique_ptr<TokenAuthenticator> auth_;
  HealthService health_{{"knnd.v1.KnnService"}, nullptr};
  std::unique_ptr<FakeService> service_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpApiTest, AnUnknownPathIs404ListingTheRoutes) {
  RawHttp::Response r = Call(RawHttp::Request("GET", "/v2/search"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Json(r).Find("code")->string_value(), "NOT_FOUND");
  EXPECT_THAT(Json(r).Find("message")->string_value(),
              HasSubstr("POST /v1/search, GET|POST /v1/index_info, POST "
                        "/v1/get, GET /healthz/live, GET /healthz/ready"));
}

TEST_F(HttpApiTest, GetTakesIdsAsStringsOrNumbersAndAnswersObjects) {
  RawHttp::Response r = Call(
      RawHttp::Request("POST", "/v1/get", R"({"ids": ["5", 6]})",
                       absl::StrCat("Authorization: Bearer ", kToken, "\r\n")));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, R"({"records":[{"id":"5","payload":{"n":5}},)"
                    R"({"id":"6","payload":{"n":6}}]})");
  EXPECT_EQ(Call(RawHttp::Request("GET", "/v1/get")).status, 405);
}

TEST_F(HttpApiTest, AMethodThePathDoesNotTakeIs405WithAllow) {
  RawHttp::Response r = Call(RawHttp::Request("GET", "/v1/search"));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
  EXPECT_EQ(service_->calls(), 0);
}

TEST_F(HttpApiTest, ABodyThatIsNotTheRequestIs400BeforeTheHandler) {
  RawHttp::Response r = Search(R"({"k": 1, "kay": 2})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r).Find("code")->string_value(), "INVALID_ARGUMENT");
  EXPECT_THAT(Json(r).Find("message")->string_value(), HasSubstr("kay"));
  EXPECT_EQ(service_->calls(), 0);
}

TEST_F(HttpApiTest, AnAnswerIsItsJsonWithPayloadsAsObjects) {
  RawHttp::Response r = Search(R"({"k": 1})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  const JsonValue answer = Json(r);
  EXPECT_EQ(answer.Find("ids")->items()[0].string_value(), "1099511627776");
  EXPECT_EQ(answer.Find("payloads")->items()[0].Find("text")->string_value(),
            "a");
  EXPECT_EQ(service_->done(), 1);
}

TEST_F(HttpApiTest, ARefusalIsItsHttpStatusWithRetryAfter) {
  RawHttp::Response r = Search(R"({"k": 2})");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(r.headers["x-knnd-retry-pushback-ms"], "50");
  EXPECT_EQ(Json(r).Find("code")->string_value(), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(Json(r).Find("message")->string_value(), "gate full");
}

TEST_F(HttpApiTest, AnAnswerGivenLaterOnAnotherThreadArrives) {
  RawHttp::Response r = Search(R"({"k": 3})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(Json(r).Find("k")->int_value(), 3);
}

TEST_F(HttpApiTest, TheTimeoutHeaderIsTheCallsDeadline) {
  const absl::Time before = absl::Now();
  Search(R"({"k": 1})", "X-Knnd-Timeout-Ms: 60000\r\n");
  EXPECT_GE(service_->deadline(), before + absl::Seconds(60));
  EXPECT_LE(service_->deadline(), absl::Now() + absl::Seconds(60));
  Search(R"({"k": 1})");
  EXPECT_EQ(service_->deadline(), absl::InfiniteFuture());
  RawHttp::Response r = Search(R"({"k": 1})", "X-Knnd-Timeout-Ms: 0\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("X-Knnd-Timeout-Ms"));
}

TEST_F(HttpApiTest, TheBearerTokenIsCheckedAsGrpcMetadataIs) {
  RawHttp::Response none =
      Call(RawHttp::Request("POST", "/v1/search", R"({"k": 1})"));
  EXPECT_EQ(none.status, 401);
  EXPECT_THAT(none.body, HasSubstr("authorization: Bearer <token>"));
  RawHttp::Response twice = Search(
      R"({"k": 1})", absl::StrCat("Authorization: Bearer ", kToken, "\r\n"));
  EXPECT_EQ(twice.status, 401);
  EXPECT_THAT(twice.body, HasSubstr("more than one"));
  RawHttp::Response wrong = Call(
      RawHttp::Request("POST", "/v1/search", R"({"k": 1})",
                       "Authorization: Bearer another-token-0123456789\r\n"));
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(Search(R"({"k": 1})").status, 200);
}

TEST_F(HttpApiTest, IndexInfoTakesGetAndPost) {
  RawHttp::Response get = Call(RawHttp::Request("GET", "/v1/index_info"));
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(Json(get).Find("dim")->int_value(), 48);
  RawHttp::Response post =
      Call(RawHttp::Request("POST", "/v1/index_info", "{}"));
  EXPECT_EQ(post.status, 200);
}

TEST_F(HttpApiTest, HealthRoutesFollowTheHealthService) {
  auto status_of = [&](const char* path) {
    RawHttp::Response r = Call(RawHttp::Request("GET", path));
    return std::make_pair(r.status, Json(r).Find("status")->string_value());
  };
  EXPECT_EQ(status_of("/healthz/live"),
            std::make_pair(503, std::string("NOT_SERVING")));
  EXPECT_EQ(status_of("/healthz/ready"),
            std::make_pair(503, std::string("NOT_SERVING")));
  health_.SetStatuses(/*services_serving=*/false, /*overall_serving=*/true);
  EXPECT_EQ(status_of("/healthz/live"),
            std::make_pair(200, std::string("SERVING")));
  EXPECT_EQ(status_of("/healthz/ready"),
            std::make_pair(503, std::string("NOT_SERVING")));
  health_.SetServing(true);
  EXPECT_EQ(status_of("/healthz/ready"),
            std::make_pair(200, std::string("SERVING")));
}

}  // namespace
}  // namespace knnd
