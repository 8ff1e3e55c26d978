// KnnServiceImpl at its own layer: the handler over a holder, gate, batcher
// and pool built with the production defaults (the Options an empty
// ServerConfig gives), served on a loopback port; each named step's answer
// as a client sees it.
#include "knnd/rpc/knn_service.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/config/server_options.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;
using knnd::testing::BuildIndex;
using knnd::testing::BuildSpec;
using knnd::testing::CallSearch;
using knnd::testing::FindSample;
using knnd::testing::IndexSpec;
using knnd::testing::MakeAttributes;
using knnd::testing::MakeData;
using knnd::testing::MakeSearchRequest;
using knnd::testing::TempDir;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

constexpr int kDim = 16;

class KnnServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const knnd::v1::ServerConfig defaults;
    metrics_ = knnd::testing::IdleMetrics();
    ASSERT_NE(metrics_, nullptr);
    ASSERT_TRUE(metrics_->StartExposer().ok());
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::Create({});
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = std::move(*auth);
    gate_ = std::make_unique<AdmissionGate>(GateOptionsFrom(defaults));
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Create(WorkerPoolOptionsFrom(defaults));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    absl::StatusOr<std::unique_ptr<Batcher>> batcher =
        Batcher::Create(BatcherOptionsFrom(defaults), pool_.get());
    ASSERT_TRUE(batcher.ok()) << batcher.status();
    batcher_ = std::move(*batcher);
    StartService(defaults);
  }

  // (Re)starts the handler with the options of `config`.
  void StartService(const knnd::v1::ServerConfig& config) {
    listener_.Close(absl::InfinitePast());
    service_ = std::make_unique<KnnServiceImpl>(
        KnnServiceOptionsFrom(config), &holder_, gate_.get(), batcher_.get(),
        metrics_.get(), auth_.get());
    absl::StatusOr<Listener> listener =
        knnd::testing::ServeOnLoopback(service_.get());
    ASSERT_TRUE(listener.ok()) << listener.status();
    stub_ = knnd::v1::KnnService::NewStub(knnd::testing::FreshChannel(
        "127.0.0.1:" + std::to_string(listener->port)));
    listener_ = std::move(*listener);
  }

  void TearDown() override { listener_.Close(absl::InfinitePast()); }

  // Loads the index at `path` as `version` and publishes it.
  void LoadAndPublish(const std::string& path, int64_t version) {
    LoadOptions options;
    options.version = version;
    options.probe_in_subprocess = false;
    absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
        IndexSnapshot::Load(path, options);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    holder_.Publish(std::move(*snapshot));
  }

  // Loads a small IVF-PQ index as `version` and publishes it.
  void Serve(int64_t version) {
    IndexSpec spec;
    spec.n = 2000;
    spec.d = kDim;
    spec.factory = "IVF16,PQ4";
    const std::string path = tmp_.path("v" + std::to_string(version));
    knnd::testing::WriteIndex(path, spec);
    LoadAndPublish(path, version);
  }

  // Builds and publishes an index of kPayloadRows rows with payloads
  // (row r: PayloadLine(r)), with own ids 7 * r + 3 when `own_ids`.
  void ServePayloads(int64_t version, bool own_ids) {
    knnd::testing::BuildSpec spec;
    spec.n = kPayloadRows;
    spec.d = kDim;
    spec.factory = "IVF16,PQ4";
    for (int64_t r = 0; r < spec.n; ++r) {
      if (own_ids) spec.ids.push_back(7 * r + 3);
      spec.payloads.push_back(PayloadLine(r));
    }
    const std::string path = tmp_.path("p" + std::to_string(version));
    knnd::testing::BuildIndex(path, spec);
    LoadAndPublish(path, version);
  }

  // Builds an index with its raw vectors and the seeded attributes
  // (MakeAttributes(kAttributeRows, 5)) as `version` and publishes it.
  void ServeWithAttributes(int64_t version) {
    BuildSpec spec;
    spec.n = kAttributeRows;
    spec.d = kDim;
    spec.factory = "IVF16,PQ8x4fs";
    spec.vectors = VectorsDtype::kFloat32;
    spec.attributes = MakeAttributes(kAttributeRows, 5);
    const std::string path = tmp_.path("a" + std::to_string(version));
    BuildIndex(path, spec);
    LoadAndPublish(path, version);
  }
  static constexpr int64_t kPayloadRows = 1000;
  // Row r's payload line; odd rows have no "page".
  static std::string PayloadLine(int64_t r) {
    return r % 2 == 0
               ? absl::StrCat("{\"text\": \"row ", r, "\", \"page\": ", r, "}")
               : absl::StrCat("\"row ", r, "\"");
  }

  static constexpr int64_t kAttributeRows = 3000;

  double Rejected(const std::string& reason) {
    return FindSample(knnd::testing::Scrape(metrics_->port()),
                      "knnd_search_rejected_total", {{"reason", reason}})
        .value_or(-1);
  }

  TempDir tmp_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<TokenAuthenticator> auth_;
  IndexHolder holder_;
  std::unique_ptr<AdmissionGate> gate_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<KnnServiceImpl> service_;
  Listener listener_;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub_;
};

TEST_F(KnnServiceTest, BeforeAnyVersionServesSearchesAreUnavailable) {
  SearchResponse response;
  grpc::Status status = CallSearch(
      *stub_, MakeSearchRequest(MakeData(1, kDim, 1), 5), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Rejected("not_ready"), 1);
}

TEST_F(KnnServiceTest, AnAnswerCarriesItsShapeAndTheVersionThatServedIt) {
  Serve(3);
  SearchRequest request = MakeSearchRequest(MakeData(4, kDim, 2), 5);
  request.set_nprobe(2);
  SearchResponse response;
  ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
  EXPECT_EQ(response.num_queries(), 4u);
  EXPECT_EQ(response.k(), 5);
  EXPECT_EQ(response.index_version(), 3);
  EXPECT_EQ(response.serving_version(), 3);
  EXPECT_EQ(response.nprobe(), 2u);
  EXPECT_EQ(response.metric(), knnd::v1::METRIC_L2);
  ASSERT_EQ(response.ids_size(), 20);
  for (int64_t id : response.ids()) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 2000);
  }
  // A build without its own ids answers with row numbers.
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(stub_->GetIndexInfo(&context, {}, &info).ok());
  EXPECT_FALSE(info.has_id_table());
  EXPECT_EQ(info.version(), 3);
  // The same answer in the bytes form.
  request.set_results_as_bytes(true);
  SearchResponse bytes;
  ASSERT_TRUE(CallSearch(*stub_, request, &bytes).ok());
  EXPECT_EQ(bytes.ids_size(), 0);
  ASSERT_EQ(bytes.ids_i64le().size(), 20 * sizeof(int64_t));
  std::vector<int64_t> ids(20);
  std::memcpy(ids.data(), bytes.ids_i64le().data(), bytes.ids_i64le().size());
  EXPECT_EQ(ids, std::vector<int64_t>(response.ids().begin(),
                                      response.ids().end()));
}

TEST_F(KnnServiceTest, AVersionNotLoadedIsRefusedNamingTheOneServing) {
  Serve(1);
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 3), 5);
  request.set_index_version(7);
  SearchResponse response;
  grpc::ClientContext context;
  grpc::Status status = CallSearch(*stub_, request, &response, &context);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("index_version=7 is not loaded here: version 1 serves"));
  const auto& trailing = context.GetServerTrailingMetadata();
  auto served = trailing.find(kServingVersionMetadata);
  ASSERT_NE(served, trailing.end());
  EXPECT_EQ(std::string(served->second.data(), served->second.size()), "1");
  EXPECT_EQ(Rejected("invalid"), 1);
  request.set_index_version(-2);
  EXPECT_THAT(CallSearch(*stub_, request, &response).error_message(),
              HasSubstr("index_version=-2 must be >= 0"));
}

TEST_F(KnnServiceTest, AnInvalidRequestIsRefusedNamingTheInputAndCounted) {
  Serve(1);
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 4), 5000);
  SearchResponse response;
  grpc::Status status = CallSearch(*stub_, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("k=5000"));
  EXPECT_EQ(Rejected("invalid"), 1);
}

// The payload of each answer entry, as knnd sends it, for row `r`:
// `fields` of PayloadLine(r) ("text", "page" or both).
std::string WantPayload(int64_t r, bool text, bool page) {
  std::vector<std::string> members;
  if (text) members.push_back(absl::StrCat("\"text\":\"row ", r, "\""));
  if (page && r % 2 == 0) members.push_back(absl::StrCat("\"page\":", r));
  return absl::StrCat("{", absl::StrJoin(members, ","), "}");
}

TEST_F(KnnServiceTest, PayloadsComeWithTheirIdsAllOrNamedFields) {
  for (bool own_ids : {false, true}) {
    SCOPED_TRACE(own_ids ? "own ids" : "row ids");
    ServePayloads(own_ids ? 2 : 1, own_ids);
    SearchRequest request = MakeSearchRequest(MakeData(3, kDim, 5), 4);
    request.set_nprobe(16);
    request.mutable_payloads()->set_all_fields(true);
    SearchResponse response;
    ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
    ASSERT_EQ(response.payloads_size(), response.ids_size());
    for (int i = 0; i < response.ids_size(); ++i) {
      const int64_t id = response.ids(i);
      ASSERT_GE(id, 0);
      const int64_t row = own_ids ? (id - 3) / 7 : id;
      EXPECT_EQ(response.payloads(i), WantPayload(row, true, true));
    }
    request.mutable_payloads()->set_all_fields(false);
    request.mutable_payloads()->add_fields("page");
    ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
    for (int i = 0; i < response.ids_size(); ++i) {
      const int64_t id = response.ids(i);
      const int64_t row = own_ids ? (id - 3) / 7 : id;
      EXPECT_EQ(response.payloads(i), WantPayload(row, false, true));
    }
    // A missing neighbour's payload is empty.
    request.add_allowed_ids(own_ids ? 3 : 0);
    ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
    EXPECT_EQ(response.ids(1), -1);
    EXPECT_EQ(response.payloads(0), WantPayload(0, false, true));
    EXPECT_EQ(response.payloads(1), "");
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    ASSERT_TRUE(stub_->GetIndexInfo(&context, {}, &info).ok());
    EXPECT_TRUE(info.has_payloads());
    EXPECT_THAT(info.payload_fields(), ::testing::ElementsAre("text", "page"));
    EXPECT_EQ(info.max_payload_bytes(),
              static_cast<int64_t>(WantPayload(998, true, true).size()));
  }
}

TEST_F(KnnServiceTest, PayloadRequestsTheIndexCannotAnswerAreRefused) {
  ServePayloads(1, /*own_ids=*/false);
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 6), 4);
  request.mutable_payloads()->add_fields("text");
  request.mutable_payloads()->add_fields("title");
  SearchResponse response;
  grpc::Status status = CallSearch(*stub_, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("\"title\""));
  EXPECT_THAT(status.error_message(), HasSubstr("its fields: text, page"));
  request.mutable_payloads()->clear_fields();
  EXPECT_EQ(CallSearch(*stub_, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  Serve(2);  // no payloads
  request.mutable_payloads()->set_all_fields(true);
  status = CallSearch(*stub_, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat(tmp_.path("v2"), " (version 2) has no "
                                     "payloads")));
}

TEST_F(KnnServiceTest, AnswersWhosePayloadsExceedTheSendLimitAreRefused) {
  knnd::v1::ServerConfig config;
  config.set_max_send_message_bytes(2048);
  StartService(config);
  ServePayloads(1, /*own_ids=*/false);
  SearchRequest request = MakeSearchRequest(MakeData(20, kDim, 7), 10);
  request.set_nprobe(16);
  SearchResponse response;
  ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());  // no payloads
  request.mutable_payloads()->set_all_fields(true);
  grpc::Status status = CallSearch(*stub_, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("more than max_send_message_bytes=2048"));
  // One query's fit.
  request = MakeSearchRequest(MakeData(1, kDim, 7), 10);
  request.mutable_payloads()->set_all_fields(true);
  EXPECT_TRUE(CallSearch(*stub_, request, &response).ok());
  EXPECT_EQ(response.payloads_size(), 10);
  // Sized exactly (a payload's tag is two bytes, field 16): an answer of
  // the limit is sent, one a byte over it refused by knnd by name (before,
  // it was sized a byte short per payload, and gRPC failed to send it).
  request = MakeSearchRequest(MakeData(5, kDim, 7), 10);
  request.mutable_payloads()->set_all_fields(true);
  config.set_max_send_message_bytes(1 << 20);
  StartService(config);
  ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
  const int64_t size = static_cast<int64_t>(response.ByteSizeLong());
  ASSERT_GE(size, 1025);  // the config's least limit is 1024
  config.set_max_send_message_bytes(static_cast<uint64_t>(size));
  StartService(config);
  EXPECT_TRUE(CallSearch(*stub_, request, &response).ok());
  config.set_max_send_message_bytes(static_cast<uint64_t>(size - 1));
  StartService(config);
  status = CallSearch(*stub_, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("the answer with its payloads would be ",
                                     size, " bytes")));
}

// genre == "news" and u < 50000, as text for a Filter.
knnd::v1::Filter NewsBelowHalf() {
  knnd::v1::Filter filter;
  knnd::v1::FilterList* all = filter.mutable_all_of();
  knnd::v1::Condition* genre = all->add_filters()->mutable_condition();
  genre->set_field("genre");
  genre->mutable_eq()->set_keyword("news");
  knnd::v1::Condition* u = all->add_filters()->mutable_condition();
  u->set_field("u");
  u->mutable_range()->mutable_lt()->set_int_value(50000);
  return filter;
}

TEST_F(KnnServiceTest, AFilteredSearchAnswersOnlyMatchingRowsAndSaysHow) {
  ServeWithAttributes(1);
  const AttributeColumns columns = MakeAttributes(kAttributeRows, 5);
  const AttributeColumn& u = columns.columns[0];
  const AttributeColumn& genre = columns.columns[1];
  auto admitted = [&](int64_t r) {
    return genre.offsets[r + 1] > genre.offsets[r] &&
           genre.dictionary[genre.codes[genre.offsets[r]]] == "news" &&
           u.ints[r] < 50000;
  };
  int64_t matching = 0;
  for (int64_t r = 0; r < kAttributeRows; ++r) matching += admitted(r);
  SearchRequest request = MakeSearchRequest(MakeData(8, kDim, 4), 10);
  *request.mutable_filter() = NewsBelowHalf();
  SearchResponse response;
  grpc::Status status = CallSearch(*stub_, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.filter_matched_rows(), static_cast<uint64_t>(matching));
  EXPECT_NE(response.filter_plan(), knnd::v1::FILTER_PLAN_UNSPECIFIED);
  ASSERT_EQ(response.ids_size(), 80);
  for (int64_t id : response.ids()) {
    ASSERT_GE(id, 0);
    EXPECT_TRUE(admitted(id)) << id;
  }
  // A filter no row passes: an empty, padded answer.
  request.mutable_filter()->mutable_condition()->set_field("genre");
  request.mutable_filter()->mutable_condition()->mutable_eq()->set_keyword(
      "opera");
  status = CallSearch(*stub_, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.filter_matched_rows(), 0u);
  for (int64_t id : response.ids()) EXPECT_EQ(id, -1);
  // GetIndexInfo names the columns a filter may test.
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(stub_->GetIndexInfo(&context, {}, &info).ok());
  ASSERT_EQ(info.attributes_size(), 5);
  EXPECT_EQ(info.attributes(1).name(), "genre");
  EXPECT_EQ(info.attributes(1).type(), "keyword");
  EXPECT_EQ(info.attributes(1).distinct_keywords(), 4);
  EXPECT_EQ(info.max_filter_conditions(), 1024u);
}

// One numeric condition, searched through its bounds, answers what the
// same condition inside all_of (compiled into a bitmap) answers, with the
// same matched rows and plan; sent again, it is compiled and kept (with
// its rows' codes where few match) and answers what the bitmap kept with
// its codes answers; with an allow-list it is folded into one.
TEST_F(KnnServiceTest, AOneColumnFilterAnswersWhatItsBitmapAnswers) {
  ServeWithAttributes(1);
  // One query: wide ranges keep their bounds (search_request.cc).
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 4), 10);
  request.set_nprobe(4);
  int same_plan = 0;
  for (double fraction : {0.01, 0.1, 0.5, 0.99}) {
    for (const char* field : {"u", "score"}) {
      knnd::v1::Filter filter;
      knnd::v1::Condition* c = filter.mutable_condition();
      c->set_field(field);
      if (c->field() == "u") {
        c->mutable_range()->mutable_lt()->set_int_value(
            static_cast<int64_t>(100000 * fraction));
      } else {
        c->mutable_range()->mutable_gte()->set_float_value(1 - fraction);
      }
      SCOPED_TRACE(filter.ShortDebugString());
      // The bitmap first, sent as a filter the cache has not seen.
      *request.mutable_filter()->mutable_all_of()->add_filters() = filter;
      SearchResponse bitmap;
      ASSERT_TRUE(CallSearch(*stub_, request, &bitmap).ok());
      *request.mutable_filter() = filter;
      SearchResponse lazy, kept;  // its first sighting, then its second
      ASSERT_TRUE(CallSearch(*stub_, request, &lazy).ok());
      ASSERT_TRUE(CallSearch(*stub_, request, &kept).ok());
      EXPECT_GT(lazy.filter_matched_rows(), 0u);
      for (const SearchResponse* r : {&lazy, &kept}) {
        EXPECT_EQ(r->filter_matched_rows(), bitmap.filter_matched_rows());
      }
      EXPECT_EQ(kept.filter_plan(), bitmap.filter_plan());
      EXPECT_THAT(kept.ids(), ::testing::ElementsAreArray(bitmap.ids()));
      EXPECT_THAT(kept.distances(),
                  ::testing::ElementsAreArray(bitmap.distances()));
      // The bounds (or a bitmap compiled at once where that is cheaper):
      // under the bitmap's plan, its answers.
      if (lazy.filter_plan() == bitmap.filter_plan()) {
        ++same_plan;
        EXPECT_THAT(lazy.ids(), ::testing::ElementsAreArray(bitmap.ids()));
        EXPECT_THAT(lazy.distances(),
                    ::testing::ElementsAreArray(bitmap.distances()));
      }
      request.clear_filter();
    }
  }
  EXPECT_GE(same_plan, 4);  // 50% and 99% at least: no codes kept
  // The first 100 rows' ids, and u < 50000 among them.
  const AttributeColumns columns = MakeAttributes(kAttributeRows, 5);
  const AttributeColumn& u = columns.columns[0];
  int64_t matching = 0;
  for (int64_t r = 0; r < 100; ++r) {
    request.add_allowed_ids(r);
    matching += u.ints[r] < 50000;
  }
  knnd::v1::Condition* c = request.mutable_filter()->mutable_condition();
  c->set_field("u");
  c->mutable_range()->mutable_lt()->set_int_value(50000);
  SearchResponse response;
  ASSERT_TRUE(CallSearch(*stub_, request, &response).ok());
  EXPECT_EQ(response.filter_matched_rows(), static_cast<uint64_t>(matching));
  for (int64_t id : response.ids()) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 100);
    EXPECT_LT(u.ints[id], 50000) << id;
  }
}

// A filter sent again is served from the version's filter cache (kept on
// its second miss, found on its third) with the same answer, counted in
// knnd_filter_cache_*; a new version starts with an empty cache.
TEST_F(KnnServiceTest, ARepeatedFilterIsServedFromTheCacheWithTheSameAnswer) {
  ServeWithAttributes(1);
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 4), 10);
  request.set_nprobe(4);
  knnd::v1::Condition* c = request.mutable_filter()->mutable_condition();
  c->set_field("u");
  c->mutable_range()->mutable_lt()->set_int_value(50000);
  auto scraped = [&](const char* name,
                     std::map<std::string, std::string> labels = {}) {
    return FindSample(knnd::testing::Scrape(metrics_->port()), name, labels)
        .value_or(-1);
  };
  std::vector<SearchResponse> answers(3);
  for (SearchResponse& answer : answers) {
    ASSERT_TRUE(CallSearch(*stub_, request, &answer).ok());
  }
  for (const SearchResponse& answer : answers) {
    EXPECT_GT(answer.filter_matched_rows(), 0u);
    EXPECT_EQ(answer.filter_matched_rows(), answers[0].filter_matched_rows());
    EXPECT_THAT(answer.ids(), ::testing::ElementsAreArray(answers[0].ids()));
    EXPECT_THAT(answer.distances(),
                ::testing::ElementsAreArray(answers[0].distances()));
  }
  EXPECT_EQ(scraped("knnd_filter_cache_lookups_total", {{"result", "hit"}}), 1);
  EXPECT_EQ(scraped("knnd_filter_cache_lookups_total", {{"result", "miss"}}),
            2);
  EXPECT_EQ(scraped("knnd_filter_cache_entries"), 1);
  const double bitmap_bytes = RowBitmap::WordsFor(kAttributeRows) * 8;
  EXPECT_GT(scraped("knnd_filter_cache_bytes"), bitmap_bytes);
  EXPECT_LT(scraped("knnd_filter_cache_bytes"), bitmap_bytes + 100);

  ServeWithAttributes(2);
  SearchResponse after_swap;
  ASSERT_TRUE(CallSearch(*stub_, request, &after_swap).ok());
  EXPECT_EQ(after_swap.index_version(), 2);
  EXPECT_EQ(scraped("knnd_filter_cache_lookups_total", {{"result", "miss"}}),
            3);
  EXPECT_EQ(scraped("knnd_filter_cache_lookups_total", {{"result", "hit"}}), 1);
}

TEST_F(KnnServiceTest, ABadFilterIsRefusedNamingTheFieldAndCounted) {
  ServeWithAttributes(1);
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 4), 5);
  knnd::v1::Condition* c = request.mutable_filter()->mutable_condition();
  c->set_field("year");
  c->set_exists(true);
  grpc::Status status = CallSearch(*stub_, request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("unknown attribute \"year\""));
  c->set_field("u");
  c->mutable_eq()->set_keyword("x");
  status = CallSearch(*stub_, request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("\"u\" has type integer"));
  EXPECT_EQ(Rejected("invalid"), 2);
  // A version without attributes, swapped in: the schema goes with it.
  Serve(2);
  c->set_exists(true);
  status = CallSearch(*stub_, request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("\"u\": the index has no attributes"));
}

TEST_F(KnnServiceTest, GetAnswersFoundRecordsOnceAndNamesTheMissing) {
  ServePayloads(4, /*own_ids=*/true);
  auto get = [this](const knnd::v1::GetRequest& request,
                    knnd::v1::GetResponse* response) {
    grpc::ClientContext context;
    return stub_->Get(&context, request, response);
  };
  knnd::v1::GetRequest request;
  for (int64_t id : {17, 99, 3, 17}) request.add_ids(id);  // rows 2, -, 0
  request.mutable_payloads()->set_all_fields(true);
  knnd::v1::GetResponse response;
  ASSERT_TRUE(get(request, &response).ok());
  ASSERT_EQ(response.records_size(), 2);
  EXPECT_EQ(response.records(0).id(), 17);
  EXPECT_EQ(response.records(0).payload(), "{\"text\":\"row 2\",\"page\":2}");
  EXPECT_EQ(response.records(1).id(), 3);
  EXPECT_THAT(response.missing(), ::testing::ElementsAre(99));
  EXPECT_EQ(response.index_version(), 4);
  EXPECT_EQ(response.serving_version(), 4);

  request.set_with_vectors(true);
  grpc::Status refused = get(request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("--keep_vectors"));

  knnd::v1::ServerConfig config;
  config.set_max_get_ids(3);
  StartService(config);
  request.set_with_vectors(false);
  const double invalid = Rejected("invalid");
  refused = get(request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("ids holds 4 ids, more than max_get_ids=3"));
  EXPECT_EQ(Rejected("invalid"), invalid + 1);
  knnd::v1::GetIndexInfoResponse info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetIndexInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.max_get_ids(), 3u);
}

}  // namespace
}  // namespace knnd
