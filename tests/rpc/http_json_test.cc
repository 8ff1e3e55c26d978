// The HTTP/JSON forms of the API: the status mapping, error bodies, request
// bodies read by protobuf's JSON parser (arrays and base64, int64 as
// strings and numbers, refusals naming the reason), answers with payloads
// spliced in as JSON objects, the deadline header and the trailers'
// headers.
#include "knnd/rpc/http_json.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/storage/json_value.h"

namespace knnd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(HttpJson, StatusCodesMapAsGoogleRpcDocumentsThem) {
  const std::vector<std::pair<absl::StatusCode, int>> table = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kCancelled, 499},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kDeadlineExceeded, 504},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kAlreadyExists, 409},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kAborted, 409},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kUnimplemented, 501},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDataLoss, 500},
      {absl::StatusCode::kUnauthenticated, 401},
  };
  for (const auto& [code, http] : table) {
    EXPECT_EQ(HttpStatusOf(code), http) << absl::StatusCodeToString(code);
  }
}

TEST(HttpJson, AnErrorBodyCarriesTheCodeNameAndTheMessageEscaped) {
  const std::string body = ErrorJson(
      absl::InvalidArgumentError("k=0 must be \"positive\"\n\xc3\xa9"));
  absl::StatusOr<JsonValue> parsed = ParseJson(body);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << body;
  EXPECT_EQ(parsed->Find("code")->string_value(), "INVALID_ARGUMENT");
  EXPECT_EQ(parsed->Find("message")->string_value(),
            "k=0 must be \"positive\"\n\xc3\xa9");
}

TEST(HttpJson, VectorsAsNumbersAndAsBase64FloatsAreTheSameQueries) {
  const std::vector<float> q = {0.5f, -1.25f, 3e-7f, 1e20f};
  knnd::v1::SearchRequest numbers;
  ASSERT_TRUE(ParseJsonRequest(
                  R"({"vectors": [0.5, -1.25, 3e-7, 1e20], "k": 2})", &numbers)
                  .ok());
  ASSERT_EQ(numbers.vectors_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(numbers.vectors(i), q[i]);
  std::string bytes(q.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), q.data(), bytes.size());
  knnd::v1::SearchRequest base64;
  ASSERT_TRUE(
      ParseJsonRequest(absl::StrCat(R"({"vectors_f32le": ")",
                                    absl::Base64Escape(bytes), R"(", "k": 2})"),
                       &base64)
          .ok());
  EXPECT_EQ(base64.vectors_f32le(), bytes);
  // lowerCamelCase names are read too.
  knnd::v1::SearchRequest camel;
  ASSERT_TRUE(ParseJsonRequest(absl::StrCat(R"({"vectorsF32le": ")",
                                            absl::Base64Escape(bytes), R"("})"),
                               &camel)
                  .ok());
  EXPECT_EQ(camel.vectors_f32le(), bytes);
}

TEST(HttpJson, Int64IdsAreReadAsStringsAndAsNumbers) {
  knnd::v1::SearchRequest request;
  ASSERT_TRUE(
      ParseJsonRequest(R"({"allowed_ids": ["9223372036854775807", 5, "-3"]})",
                       &request)
          .ok());
  EXPECT_THAT(request.allowed_ids(),
              ElementsAre(int64_t{9223372036854775807}, 5, -3));
}

TEST(HttpJson, BadBodiesAreInvalidArgumentNamingTheTypeAndTheReason) {
  struct Case {
    const char* body;
    const char* reason;
  };
  for (const Case& c :
       {Case{R"({"k": 3, "kk": 1})", "kk"}, Case{R"({"k": "three"})", "three"},
        Case{R"({"vectors": "abc"})", "vectors"}, Case{R"({"k": 3)", ""},
        Case{"[1, 2]", ""}, Case{R"({"k": 3} trailing)", ""}}) {
    knnd::v1::SearchRequest request;
    absl::Status s = ParseJsonRequest(c.body, &request);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.body << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("knnd.v1.SearchRequest")) << c.body;
    EXPECT_THAT(s.message(), HasSubstr(c.reason)) << c.body;
  }
}

TEST(HttpJson, AnEmptyBodyIsTheEmptyMessage) {
  knnd::v1::GetIndexInfoRequest request;
  EXPECT_TRUE(ParseJsonRequest("", &request).ok());
  EXPECT_TRUE(ParseJsonRequest(" \r\n", &request).ok());
}

TEST(HttpJson, AnswersUseTheProtoNamesAndLeaveDefaultsOut) {
  knnd::v1::SearchResponse response;
  response.set_k(2);
  response.add_ids(int64_t{1} << 60);
  response.add_ids(-1);
  response.add_distances(0.1f);
  response.add_distances(std::numeric_limits<float>::infinity());
  std::string json;
  ASSERT_TRUE(ResponseJson(&response, &json).ok());
  absl::StatusOr<JsonValue> parsed = ParseJson(json);
  ASSERT_TRUE(parsed.ok()) << json;
  EXPECT_EQ(parsed->Find("ids")->items()[0].string_value(),
            "1152921504606846976");
  EXPECT_EQ(parsed->Find("distances")->items()[1].string_value(), "Infinity");
  EXPECT_EQ(parsed->Find("k")->int_value(), 2);
  // At their default: left out, as the canonical mapping writes them.
  EXPECT_EQ(parsed->Find("refine_factor"), nullptr);
  EXPECT_EQ(parsed->Find("metric"), nullptr);
  EXPECT_EQ(parsed->Find("payloads"), nullptr);
  response.set_metric(knnd::v1::METRIC_COSINE);
  json.clear();
  ASSERT_TRUE(ResponseJson(&response, &json).ok());
  EXPECT_EQ(ParseJson(json)->Find("metric")->string_value(), "METRIC_COSINE");
  // An empty answer is an empty object, payloads or not.
  knnd::v1::SearchResponse empty;
  json.clear();
  ASSERT_TRUE(ResponseJson(&empty, &json).ok());
  EXPECT_EQ(json, "{}");
  empty.add_payloads("");
  json.clear();
  ASSERT_TRUE(ResponseJson(&empty, &json).ok());
  EXPECT_EQ(json, "{\"payloads\":[null]}");
}

TEST(HttpJson, PrintedDistancesReadBackBitForBit) {
  knnd::v1::SearchResponse response;
  uint32_t bits = 0x3f800001u;  // next float after 1, then a spread
  for (int i = 0; i < 2000; ++i, bits = bits * 2654435761u + 12345u) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (std::isfinite(f)) response.add_distances(f);
  }
  std::string json;
  ASSERT_TRUE(ResponseJson(&response, &json).ok());
  knnd::v1::SearchResponse back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  ASSERT_EQ(back.distances_size(), response.distances_size());
  for (int i = 0; i < response.distances_size(); ++i) {
    const float want = response.distances(i), got = back.distances(i);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << want;
  }
}

TEST(HttpJson, PayloadsAreSplicedAsObjectsAndNullForMissingNeighbours) {
  knnd::v1::SearchResponse response;
  response.set_k(3);
  for (int64_t id : {7, 8, -1}) response.add_ids(id);
  // What knnd stores: compact JSON objects, strings escaped; one holds the
  // very text the splice looks for.
  const std::vector<std::string> payloads = {
      R"({"text":"\"payloads\":[] is here","page":3})",
      "{\"text\":\"caf\xc3\xa9 \\u2028\",\"tags\":[1,[2,{}]]}", ""};
  for (const std::string& p : payloads) response.add_payloads(p);
  response.mutable_shard()->set_build_id(R"(b"payloads":[]")");
  std::string json;
  ASSERT_TRUE(ResponseJson(&response, &json).ok());
  absl::StatusOr<JsonValue> parsed = ParseJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << json;
  const std::vector<JsonValue>& got = parsed->Find("payloads")->items();
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<JsonValue> stored = ParseJson(payloads[i]);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(got[i], *stored) << payloads[i];
  }
  EXPECT_EQ(got[2].type(), JsonValue::Type::kNull);
  EXPECT_EQ(parsed->Find("shard")->Find("build_id")->string_value(),
            R"(b"payloads":[]")");
  // The response itself keeps its payloads.
  EXPECT_EQ(response.payloads_size(), 3);
}

TEST(HttpJson, GetRecordsCarryTheirIdAndTheirJsonFieldsAsObjects) {
  knnd::v1::GetResponse response;
  response.set_index_version(2);
  knnd::v1::Record* zero = response.add_records();  // id 0: still printed
  zero->set_payload(R"({"text":"\"id\":\"9\"","page":0})");
  zero->set_attributes(R"({"genre":"news","tags":["a"]})");
  for (float v : {0.1f, -2.5f}) zero->add_vector(v);
  response.add_records()->set_id(9);  // nothing asked beside the id
  response.add_missing(5);
  std::string json;
  ASSERT_TRUE(ResponseJson(&response, &json).ok());
  EXPECT_EQ(json,
            R"({"missing":["5"],"index_version":"2","records":[)"
            R"({"vector":[0.1,-2.5],"id":"0","payload":{"text":"\"id\":\"9\"",)"
            R"("page":0},"attributes":{"genre":"news","tags":["a"]}},)"
            R"({"id":"9"}]})");
  ASSERT_TRUE(ParseJson(json).ok()) << json;
  // The response keeps its records as they were.
  EXPECT_EQ(response.records(0).id(), 0);
  EXPECT_EQ(response.records(0).attributes(),
            R"({"genre":"news","tags":["a"]})");
  // Every id missing: "records" is still there, empty.
  knnd::v1::GetResponse empty;
  empty.add_missing(1);
  json.clear();
  ASSERT_TRUE(ResponseJson(&empty, &json).ok());
  EXPECT_EQ(json, R"({"missing":["1"],"records":[]})");
}

TEST(HttpJson, TheDeadlineHeaderIsMillisecondsFromTheStart) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_EQ(*DeadlineOf(absl::nullopt, start), absl::InfiniteFuture());
  EXPECT_EQ(*DeadlineOf("250", start), start + absl::Milliseconds(250));
  for (const char* bad : {"0", "-5", "1.5", "abc", "", "86400001"}) {
    absl::StatusOr<absl::Time> d = DeadlineOf(absl::string_view(bad), start);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr(kTimeoutHeader));
    EXPECT_THAT(d.status().message(), HasSubstr("86400000"));
  }
}

TEST(HttpJson, ThePushbackBecomesRetryAfterInWholeSeconds) {
  EXPECT_THAT(TrailerHeaders(
                  {{kPushbackMetadata, "50"}, {"knnd-serving-version", "3"}}),
              ElementsAre(Pair("Retry-After", "1"),
                          Pair("X-Knnd-Retry-Pushback-Ms", "50"),
                          Pair("knnd-serving-version", "3")));
  EXPECT_THAT(TrailerHeaders({{kPushbackMetadata, "2500"}}),
              ElementsAre(Pair("Retry-After", "3"),
                          Pair("X-Knnd-Retry-Pushback-Ms", "2500")));
}

}  // namespace
}  // namespace knnd
