// knnd as the front of a sharded index, end to end in one process: an
// index split with ShardIndexFile (knnctl shard's work), one Server per
// shard, a front Server with shard_targets, and the unsharded index served
// beside them as the reference (docs/sharding.md).
#include "knnd/rpc/shard_front.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "knnd/config/config.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/index_builder.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/vectors_file.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using knnd::testing::BuildIndex;
using knnd::testing::BuildSpec;
using knnd::testing::CallSearch;
using knnd::testing::FrontConfig;
using knnd::testing::MakeData;
using knnd::testing::MakeSearchRequest;
using knnd::testing::RunningServer;
using knnd::testing::ServedShardSet;
using knnd::testing::ServeShardSet;
using knnd::testing::StartServer;
using knnd::testing::TempDir;
using knnd::testing::TestConfig;
using knnd::testing::WaitReady;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;
using ::testing::HasSubstr;

constexpr int kShards = 3;
constexpr int kDim = 32;

BuildSpec Spec(uint32_t seed) {
  BuildSpec spec;
  spec.n = 3000;
  spec.d = kDim;
  spec.seed = seed;
  // 32 sub-quantizers: codes of sub-quantizers 16 and up are repacked too.
  spec.factory = "IVF32,PQ32x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  spec.attributes = knnd::testing::MakeAttributes(spec.n, seed);
  return spec;
}

// Equal answers up to the order of equal distances: every distance equal,
// and per query the ids at each distance the same, except at the row's
// last distance, where the k-th place may take any of a tie.
void ExpectSameAnswers(const SearchResponse& merged, const SearchResponse& whole,
                       const std::string& what) {
  ASSERT_EQ(merged.num_queries(), whole.num_queries()) << what;
  ASSERT_EQ(merged.k(), whole.k()) << what;
  ASSERT_EQ(merged.ids_size(), whole.ids_size()) << what;
  const int k = whole.k();
  int differing = 0;
  for (uint32_t q = 0; q < whole.num_queries(); ++q) {
    std::map<float, std::set<int64_t>> a;
    std::map<float, std::set<int64_t>> b;
    const float last = whole.distances(q * k + k - 1);
    for (int j = 0; j < k; ++j) {
      const int at = static_cast<int>(q * k + j);
      EXPECT_EQ(merged.distances(at), whole.distances(at))
          << what << ": query " << q << " rank " << j;
      if (whole.distances(at) != last) {
        a[merged.distances(at)].insert(merged.ids(at));
        b[whole.distances(at)].insert(whole.ids(at));
      }
      differing += merged.ids(at) != whole.ids(at);
    }
    EXPECT_EQ(a, b) << what << ": query " << q;
  }
  // Ties reorder a few, never most.
  EXPECT_LT(differing, merged.ids_size() / 10 + 1) << what;
}

// The same search through `front` and through the unsharded `whole`.
void CompareThrough(const RunningServer& front, const RunningServer& whole,
                    const SearchRequest& request, const std::string& what) {
  SearchResponse merged;
  SearchResponse answer;
  grpc::Status a = CallSearch(*front.stub, request, &merged);
  grpc::Status b = CallSearch(*whole.stub, request, &answer);
  ASSERT_TRUE(a.ok()) << what << ": " << a.error_message();
  ASSERT_TRUE(b.ok()) << what << ": " << b.error_message();
  EXPECT_EQ(merged.refine_factor(), answer.refine_factor()) << what;
  EXPECT_EQ(merged.nprobe(), answer.nprobe()) << what;
  EXPECT_TRUE(merged.missing_shards().empty()) << what;
  EXPECT_EQ(merged.approx_distances_size(), 0) << what;
  ExpectSameAnswers(merged, answer, what);
}

class ShardFrontTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    index_ = tmp_->path("index.faiss");
    base_ = new std::vector<float>(BuildIndex(index_, Spec(7)));
    absl::StatusOr<std::vector<ShardSpec>> plan =
        ShardIndexFile(index_, kShards, index_, "test");
    ASSERT_TRUE(plan.ok()) << plan.status();
  }
  static void TearDownTestSuite() {
    delete base_;
    delete tmp_;
  }

  void SetUp() override {
    whole_ = StartServer(TestConfig(index_));
    for (int s = 0; s < kShards; ++s) {
      shards_.push_back(StartServer(TestConfig(ShardPath(index_, s, kShards))));
    }
    // In another order than the shard ids: the front learns them.
    front_ = StartServer(FrontConfig(
        {shards_[2].address, shards_[0].address, shards_[1].address}));
    ASSERT_TRUE(WaitReady(front_));
  }

  // The same search through the front and through the unsharded server.
  void Compare(const SearchRequest& request, const std::string& what) {
    CompareThrough(front_, whole_, request, what);
  }

  static TempDir* tmp_;
  static std::string index_;
  static std::vector<float>* base_;
  RunningServer whole_;
  std::vector<RunningServer> shards_;
  RunningServer front_;
};

TempDir* ShardFrontTest::tmp_ = nullptr;
std::string ShardFrontTest::index_;
std::vector<float>* ShardFrontTest::base_ = nullptr;

TEST_F(ShardFrontTest, MergedAnswersEqualTheUnshardedIndex) {
  const std::vector<float> queries = MakeData(100, kDim, 99);
  const std::vector<float> one(queries.begin(), queries.begin() + kDim);
  for (const std::vector<float>* q : {&one, &queries}) {
    for (int refine : {0, 3}) {
      for (bool filter : {false, true}) {
        SearchRequest request = MakeSearchRequest(*q, 10);
        request.set_nprobe(4);
        request.set_refine_factor(static_cast<uint32_t>(refine));
        if (filter) {
          // Every third id, across all shards' ranges.
          for (int64_t id = 0; id < 3000; id += 3) request.add_allowed_ids(id);
        }
        Compare(request, absl::StrCat(q->size() / kDim, " queries, refine ",
                                      refine, filter ? ", filtered" : ""));
      }
    }
  }
}

// A float16 request passes through the front as it came: the shards widen
// it, and the merged answer is the unsharded index's to the same request.
TEST_F(ShardFrontTest, HalfPrecisionQueriesMergeLikeFloatOnes) {
  const std::vector<float> queries = MakeData(40, kDim, 97);
  std::string halves;
  for (const float v : queries) {
    const uint16_t h = FloatToHalf(v);
    halves.push_back(static_cast<char>(h & 0xff));
    halves.push_back(static_cast<char>(h >> 8));
  }
  for (int refine : {0, 3}) {
    SearchRequest request;
    request.set_k(10);
    request.set_nprobe(4);
    request.set_refine_factor(static_cast<uint32_t>(refine));
    request.set_vectors_f16le(halves);
    Compare(request, absl::StrCat("float16 queries, refine ", refine));
  }
}

// "u" below `bound` (of 100000): that fraction of the rows.
knnd::v1::Filter UBelow(int64_t bound) {
  knnd::v1::Filter filter;
  knnd::v1::Condition* c = filter.mutable_condition();
  c->set_field("u");
  c->mutable_range()->mutable_lt()->set_int_value(bound);
  return filter;
}

// A filter goes to every shard: few matching rows (every shard searches
// them exactly) merge into the unsharded answer; many match rows of every
// shard, and the merged answer holds k of them, its matched rows the sum.
TEST_F(ShardFrontTest, FiltersReachEveryShardAndMerge) {
  const std::vector<float> queries = MakeData(20, kDim, 98);
  for (int refine : {0, 3}) {
    SearchRequest request = MakeSearchRequest(queries, 10);
    request.set_nprobe(4);
    request.set_refine_factor(static_cast<uint32_t>(refine));
    *request.mutable_filter() = UBelow(2000);
    Compare(request, absl::StrCat("2% filter, refine ", refine));
    // The same rows written as another filter, seen for the first time:
    // a filter seen again is kept with its codes, and searched by the flat
    // plan where that beats the exact one (filter_planner.h).
    request.mutable_filter()->mutable_condition()->mutable_range()->Clear();
    request.mutable_filter()
        ->mutable_condition()
        ->mutable_range()
        ->mutable_lte()
        ->set_int_value(1999 + refine);  // u is an integer: u < 2000 (+1)
    SearchResponse merged;
    ASSERT_TRUE(CallSearch(*front_.stub, request, &merged).ok());
    SearchResponse whole;
    ASSERT_TRUE(CallSearch(*whole_.stub, request, &whole).ok());
    EXPECT_EQ(merged.filter_matched_rows(), whole.filter_matched_rows());
    EXPECT_EQ(merged.filter_plan(), knnd::v1::FILTER_PLAN_EXACT);

    *request.mutable_filter() = UBelow(60000);
    ASSERT_TRUE(CallSearch(*front_.stub, request, &merged).ok());
    ASSERT_TRUE(CallSearch(*whole_.stub, request, &whole).ok());
    EXPECT_EQ(merged.filter_matched_rows(), whole.filter_matched_rows());

    // What a front asks of a shard: filtered, its k best exact distances
    // are all the merge can use, so no candidates come back; both for one
    // numeric condition (searched through its bounds) and for a compound
    // filter (a row bitmap).
    knnd::v1::Filter compound;
    *compound.mutable_all_of()->add_filters() = UBelow(60000);
    *compound.mutable_all_of()->add_filters() = UBelow(90000);
    for (const knnd::v1::Filter& filter : {UBelow(60000), compound}) {
      SearchRequest to_shard = request;
      *to_shard.mutable_filter() = filter;
      to_shard.set_return_candidates(true);
      SearchResponse shard;
      ASSERT_TRUE(CallSearch(*shards_[0].stub, to_shard, &shard).ok());
      EXPECT_EQ(shard.k(), 10) << "refine " << refine;
      EXPECT_EQ(shard.ids_size(), 20 * 10);
      EXPECT_EQ(shard.approx_distances_size(), 0);
      EXPECT_EQ(shard.filter_plan(), knnd::v1::FILTER_PLAN_IVF);
    }
    const AttributeColumns attributes = knnd::testing::MakeAttributes(3000, 7);
    for (int64_t id : merged.ids()) {
      ASSERT_GE(id, 0);
      EXPECT_LT(attributes.columns[0].ints[id], 60000) << id;
    }
  }
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(front_.stub->GetIndexInfo(&context, {}, &info).ok());
  ASSERT_EQ(info.attributes_size(), 5);
  EXPECT_EQ(info.attributes(0).name(), "u");
  EXPECT_EQ(info.attributes(0).rows_with_value(), 3000);
}

// A bytes field's values, in order (the host is little-endian).
template <typename T>
std::vector<T> DecodeValues(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  // An empty field decodes to no values (memcpy's pointers must not be
  // null, even for no bytes).
  if (!values.empty()) {
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  }
  return values;
}

template <typename T>
std::vector<T> Values(const google::protobuf::RepeatedField<T>& field) {
  return std::vector<T>(field.begin(), field.end());
}

// results_as_bytes: a shard (with its candidates' estimates), the whole
// index and the front (which asks its shards for bytes in every case)
// answer in the bytes fields what they answer in the repeated ones.
TEST_F(ShardFrontTest, BytesResultsHoldWhatTheRepeatedFieldsHold) {
  const std::vector<float> queries = MakeData(20, kDim, 41);
  for (const RunningServer* server : {&shards_[0], &whole_, &front_}) {
    for (int refine : {0, 3}) {
      const std::string what =
          absl::StrCat(server->address, " refine ", refine);
      SearchRequest request = MakeSearchRequest(queries, 10);
      request.set_nprobe(4);
      request.set_refine_factor(static_cast<uint32_t>(refine));
      request.set_return_candidates(server == &shards_[0]);
      SearchResponse repeated;
      ASSERT_TRUE(CallSearch(*server->stub, request, &repeated).ok()) << what;
      request.set_results_as_bytes(true);
      SearchResponse bytes;
      ASSERT_TRUE(CallSearch(*server->stub, request, &bytes).ok()) << what;
      EXPECT_EQ(DecodeValues<int64_t>(bytes.ids_i64le()),
                Values(repeated.ids()))
          << what;
      EXPECT_EQ(DecodeValues<float>(bytes.distances_f32le()),
                Values(repeated.distances()))
          << what;
      EXPECT_EQ(DecodeValues<float>(bytes.approx_distances_f32le()),
                Values(repeated.approx_distances()))
          << what;
      EXPECT_EQ(bytes.ids_size() + bytes.distances_size() +
                    bytes.approx_distances_size(),
                0)
          << what;
      EXPECT_TRUE(repeated.ids_i64le().empty()) << what;
      EXPECT_EQ(repeated.ids_size(), 20 * repeated.k()) << what;
      EXPECT_EQ(bytes.k(), repeated.k()) << what;
    }
  }
}

// Own ids (seeded 63-bit hashes, in no order): the shards split the rows,
// each with its slice of the id table; merged answers, filtered by the
// user's ids too, equal the unsharded index's and carry only its ids.
TEST(ShardFrontOwnIds, MergedAnswersEqualTheUnshardedIndex) {
  TempDir tmp;
  const std::string index = tmp.path("own.index");
  BuildSpec spec = Spec(7);
  std::mt19937_64 rng(21);
  for (int64_t i = 0; i < spec.n; ++i) {
    spec.ids.push_back(static_cast<int64_t>(rng() >> 1));
  }
  BuildIndex(index, spec);
  ServedShardSet set = ServeShardSet(index, kShards);
  const RunningServer& whole = set.whole;
  const RunningServer& front = set.front;
  // The whole index and the front over its shards say the ids are the
  // index's own.
  for (const RunningServer* server : {&whole, &front}) {
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    ASSERT_TRUE(server->stub->GetIndexInfo(&context, {}, &info).ok());
    EXPECT_TRUE(info.has_id_table()) << server->address;
  }
  const std::set<int64_t> own(spec.ids.begin(), spec.ids.end());
  const std::vector<float> queries = MakeData(100, kDim, 99);
  for (int refine : {0, 3}) {
    for (bool filter : {false, true}) {
      SearchRequest request = MakeSearchRequest(queries, 10);
      request.set_nprobe(4);
      request.set_refine_factor(static_cast<uint32_t>(refine));
      if (filter) {
        // The ids of every third row, across all shards, and ids no row has.
        for (int64_t row = 0; row < spec.n; row += 3) {
          request.add_allowed_ids(spec.ids[row]);
          request.add_allowed_ids(spec.ids[row] ^ 1);
        }
      }
      const std::string what =
          absl::StrCat("own ids, refine ", refine, filter ? ", filtered" : "");
      CompareThrough(front, whole, request, what);
      SearchResponse merged;
      ASSERT_TRUE(CallSearch(*front.stub, request, &merged).ok());
      for (int64_t id : merged.ids()) {
        ASSERT_TRUE(own.count(id) == 1) << what << ": id " << id;
      }
    }
  }
}

// An own-id index with payloads split with ShardIndexFile, each shard with
// its rows' payloads: the front's merged answers carry, for each merged id,
// the payload the unsharded index has for it, re-ranked or not.
TEST(ShardFrontPayloads, MergedPayloadsAreTheUnshardedIndexs) {
  TempDir tmp;
  const std::string index = tmp.path("payloads.index");
  BuildSpec spec = Spec(9);
  std::map<int64_t, std::string> payload_of;  // by id, as knnd sends it
  for (int64_t row = 0; row < spec.n; ++row) {
    spec.ids.push_back(11 * row + 5);
    spec.payloads.push_back(absl::StrCat(
        "{\"row\": ", row, ", \"text\": \"chunk ", row, "\"}"));
    payload_of[spec.ids.back()] =
        absl::StrCat("{\"row\":", row, ",\"text\":\"chunk ", row, "\"}");
  }
  BuildIndex(index, spec);
  ServedShardSet set = ServeShardSet(index, kShards);
  const RunningServer& whole = set.whole;
  const RunningServer& front = set.front;
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(front.stub->GetIndexInfo(&context, {}, &info).ok());
  EXPECT_TRUE(info.has_payloads());
  EXPECT_THAT(info.payload_fields(), ::testing::ElementsAre("row", "text"));
  grpc::ClientContext whole_context;
  knnd::v1::GetIndexInfoResponse whole_info;
  ASSERT_TRUE(
      whole.stub->GetIndexInfo(&whole_context, {}, &whole_info).ok());
  EXPECT_EQ(info.max_payload_bytes(), whole_info.max_payload_bytes());
  EXPECT_GT(info.max_payload_bytes(), 0);
  for (int refine : {0, 3}) {
    SearchRequest request = MakeSearchRequest(MakeData(50, kDim, 98), 10);
    request.set_nprobe(4);
    request.set_refine_factor(static_cast<uint32_t>(refine));
    request.mutable_payloads()->set_all_fields(true);
    const std::string what = absl::StrCat("payloads, refine ", refine);
    CompareThrough(front, whole, request, what);
    for (const RunningServer* server : {&front, &whole}) {
      SearchResponse answer;
      ASSERT_TRUE(CallSearch(*server->stub, request, &answer).ok());
      ASSERT_EQ(answer.payloads_size(), answer.ids_size()) << what;
      for (int i = 0; i < answer.ids_size(); ++i) {
        EXPECT_EQ(answer.payloads(i), payload_of[answer.ids(i)])
            << what << " " << server->address << " entry " << i;
      }
    }
  }
}

TEST_F(ShardFrontTest, ShardsSayWhichPartTheyHoldAndTheFrontDescribesTheSet) {
  std::set<int64_t> firsts;
  std::string build;
  for (int s = 0; s < kShards; ++s) {
    SearchResponse response;
    ASSERT_TRUE(CallSearch(*shards_[s].stub,
                           MakeSearchRequest(MakeData(1, kDim, 3), 5),
                           &response)
                    .ok());
    EXPECT_EQ(response.shard().shard_id(), static_cast<uint32_t>(s));
    EXPECT_EQ(response.shard().shard_count(), static_cast<uint32_t>(kShards));
    EXPECT_EQ(response.shard().first_id(), s * 3000 / kShards);
    EXPECT_EQ(response.shard().end_id(), (s + 1) * 3000 / kShards);
    EXPECT_EQ(response.serving_version(), response.index_version());
    for (int64_t id : response.ids()) {
      EXPECT_GE(id, response.shard().first_id());
      EXPECT_LT(id, response.shard().end_id());
    }
    if (s == 0) build = response.shard().build_id();
    EXPECT_EQ(response.shard().build_id(), build);
    EXPECT_FALSE(build.empty());
  }
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(front_.stub->GetIndexInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.ntotal(), 3000);
  EXPECT_EQ(info.dim(), static_cast<uint32_t>(kDim));
  EXPECT_EQ(info.shard().shard_count(), static_cast<uint32_t>(kShards));
  EXPECT_EQ(info.shard().build_id(), build);
  EXPECT_TRUE(info.has_vectors());
  EXPECT_THAT(info.path(), HasSubstr(shards_[1].address));
}

TEST_F(ShardFrontTest, AShardDownFailsTheCallOrGivesPartialResultsNamingIt) {
  shards_[1].server.reset();  // shard 1 stops answering
  SearchRequest request = MakeSearchRequest(MakeData(4, kDim, 5), 10);
  SearchResponse response;
  grpc::Status failed = CallSearch(*front_.stub, request, &response);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(failed.error_message(), HasSubstr("1 of 3 shards failed"));
  EXPECT_THAT(failed.error_message(),
              HasSubstr(absl::StrCat("shard 1 (", shards_[1].address, ")")));

  request.set_allow_partial_results(true);
  grpc::Status partial = CallSearch(*front_.stub, request, &response);
  ASSERT_TRUE(partial.ok()) << partial.error_message();
  EXPECT_THAT(response.missing_shards(), ::testing::ElementsAre(1u));
  for (int64_t id : response.ids()) {
    EXPECT_TRUE(id < 1000 || id >= 2000) << id;  // shard 1 held [1000, 2000)
  }
  // The front's metrics name the shard that fails and the ones that answer.
  absl::SleepFor(absl::Milliseconds(300));  // a poll after the stop
  const std::vector<knnd::testing::Sample> samples =
      knnd::testing::Scrape(front_.server->metrics_port());
  const std::string down = shards_[1].address;
  const std::string up = shards_[0].address;
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_calls_total",
                                      {{"target", down}, {"grpc_code", "OK"}}),
            0.0);
  EXPECT_EQ(knnd::testing::FindSample(
                samples, "knnd_shard_calls_total",
                {{"target", down}, {"grpc_code", "UNAVAILABLE"}}),
            2.0);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_calls_total",
                                      {{"target", up}, {"grpc_code", "OK"}}),
            2.0);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_call_seconds_count",
                                      {{"target", up}}),
            2.0);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_up",
                                      {{"target", down}}),
            0.0);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_up",
                                      {{"target", up}}),
            1.0);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_shard_serving_version",
                                      {{"target", up}}),
            1.0);
}

// A front that once heard of its shards keeps the index's shape when every
// poll fails (a busy machine can make healthy shards miss a poll's
// deadline): calls still go out and fail naming each shard, and a partial
// call says which are missing, instead of "not ready" for everyone.
TEST_F(ShardFrontTest, EveryShardDownStillNamesTheShards) {
  for (RunningServer& shard : shards_) shard.server.reset();
  absl::SleepFor(absl::Milliseconds(300));  // a poll after the stop
  SearchRequest request = MakeSearchRequest(MakeData(2, kDim, 6), 10);
  SearchResponse response;
  grpc::Status failed = CallSearch(*front_.stub, request, &response);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(failed.error_message(), HasSubstr("3 of 3 shards failed"));
  for (int s = 0; s < kShards; ++s) {
    EXPECT_THAT(failed.error_message(),
                HasSubstr(absl::StrCat("shard ", s, " (", shards_[s].address,
                                       ")")));
  }
  request.set_allow_partial_results(true);
  grpc::Status partial = CallSearch(*front_.stub, request, &response);
  EXPECT_FALSE(partial.ok());
  EXPECT_THAT(partial.error_message(), HasSubstr("3 of 3 shards failed"));
}

TEST_F(ShardFrontTest, AWholeIndexAmongTheTargetsIsRefused) {
  RunningServer mixed = StartServer(
      FrontConfig({whole_.address, shards_[1].address, shards_[2].address}));
  absl::SleepFor(absl::Milliseconds(500));  // several polls
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  grpc::Status status = mixed.stub->GetIndexInfo(&context, {}, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("target ", whole_.address,
                                     " serves a whole index, not a shard")));
  // Alive (liveness) but not ready (readiness): restarting the front would
  // not fix its shards.
  using Health = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(knnd::testing::CheckHealth(mixed.channel, ""), Health::SERVING);
  EXPECT_EQ(knnd::testing::CheckHealth(mixed.channel, "knnd.v1.KnnService"),
            Health::NOT_SERVING);
  EXPECT_EQ(knnd::testing::CheckHealth(front_.channel, "knnd.v1.KnnService"),
            Health::SERVING);
  SearchResponse response;
  grpc::Status search = CallSearch(
      *mixed.stub, MakeSearchRequest(MakeData(1, kDim, 5), 5), &response);
  EXPECT_EQ(search.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(search.error_message(), HasSubstr("serves a whole index"));
}

// A shard (or anything answering on its address) that reports a shard_id
// outside the set, in its info and in its answers: the front must refuse
// it by name, never index its tables with the value, and keep serving.
class LyingShard final : public knnd::v1::KnnService::Service {
 public:
  LyingShard(knnd::v1::KnnService::Stub* real, uint32_t shard_id)
      : real_(real), shard_id_(shard_id) {}

  grpc::Status GetIndexInfo(grpc::ServerContext*,
                            const knnd::v1::GetIndexInfoRequest* request,
                            knnd::v1::GetIndexInfoResponse* response) override {
    grpc::ClientContext context;
    grpc::Status status = real_->GetIndexInfo(&context, *request, response);
    response->mutable_shard()->set_shard_id(shard_id_);
    return status;
  }
  grpc::Status Search(grpc::ServerContext*, const SearchRequest* request,
                      SearchResponse* response) override {
    grpc::ClientContext context;
    grpc::Status status = real_->Search(&context, *request, response);
    response->mutable_shard()->set_shard_id(shard_id_);
    return status;
  }

 private:
  knnd::v1::KnnService::Stub* const real_;
  const uint32_t shard_id_;
};

TEST_F(ShardFrontTest, AShardReportingAnIdOutsideTheSetIsRefusedByName) {
  for (uint32_t lie : {3u, 1000u, 4294967295u}) {
    LyingShard liar(shards_[0].stub.get(), lie);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&liar);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    const std::string address = absl::StrCat("127.0.0.1:", port);
    RunningServer front = StartServer(
        FrontConfig({address, shards_[1].address, shards_[2].address}));
    absl::SleepFor(absl::Milliseconds(400));  // several polls
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    grpc::Status status = front.stub->GetIndexInfo(&context, {}, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << lie;
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("target ", address, " reports shard_id ",
                                       lie, " of a set of 3, outside [0, 3)")));
    // Its answers are refused too, also when partial results are allowed,
    // and the front keeps answering every call.
    for (bool partial : {false, true}) {
      SearchRequest request = MakeSearchRequest(MakeData(4, kDim, 5), 5);
      request.set_allow_partial_results(partial);
      SearchResponse response;
      grpc::Status search = CallSearch(*front.stub, request, &response);
      EXPECT_EQ(search.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << lie << " partial " << partial << ": " << search.error_message();
      EXPECT_THAT(search.error_message(), HasSubstr("shard_id"));
    }
    using Health = grpc::health::v1::HealthCheckResponse;
    EXPECT_EQ(knnd::testing::CheckHealth(front.channel, ""), Health::SERVING);
    EXPECT_EQ(knnd::testing::CheckHealth(front.channel, "knnd.v1.KnnService"),
              Health::NOT_SERVING);
    front.server.reset();
    server->Shutdown();
  }
  // The honest front beside it serves throughout.
  SearchResponse response;
  EXPECT_TRUE(CallSearch(*front_.stub,
                         MakeSearchRequest(MakeData(2, kDim, 6), 5), &response)
                  .ok());
}

// Shards swap versions one at a time (each its own versions directory);
// the front keeps answering from the version all of them have, and serves
// the new one only when every shard has it: no answer mixes versions.
TEST(ShardFrontVersions, ANewVersionServesOnlyOnceEveryShardHasIt) {
  TempDir tmp;
  // Two builds of different data, each split into shards.
  const std::string v1 = tmp.path("v1.faiss");
  const std::string v2 = tmp.path("v2.faiss");
  BuildIndex(v1, Spec(7));
  BuildIndex(v2, Spec(8));
  ASSERT_TRUE(ShardIndexFile(v1, kShards, v1, "test").ok());
  ASSERT_TRUE(ShardIndexFile(v2, kShards, v2, "test").ok());
  RunningServer whole1 = StartServer(TestConfig(v1));
  RunningServer whole2 = StartServer(TestConfig(v2));
  std::vector<RunningServer> shards;
  std::vector<std::string> targets;
  for (int s = 0; s < kShards; ++s) {
    const std::string dir = tmp.path(absl::StrCat("shard-", s));
    ASSERT_TRUE(PublishVersion(dir, ShardPath(v1, s, kShards)).ok());
    knnd::v1::ServerConfig config = TestConfig(dir);
    config.set_keep_previous_versions(s == 0 ? 1 : 0);
    shards.push_back(StartServer(config));
    targets.push_back(shards.back().address);
  }
  RunningServer front = StartServer(FrontConfig(targets));
  ASSERT_TRUE(WaitReady(front));
  const SearchRequest request = MakeSearchRequest(MakeData(20, kDim, 11), 10);
  SearchResponse reference1;
  SearchResponse reference2;
  ASSERT_TRUE(CallSearch(*whole1.stub, request, &reference1).ok());
  ASSERT_TRUE(CallSearch(*whole2.stub, request, &reference2).ok());
  auto search = [&](SearchResponse* response) {
    *response = SearchResponse();
    return CallSearch(*front.stub, request, response);
  };
  SearchResponse response;
  ASSERT_TRUE(search(&response).ok());
  EXPECT_EQ(response.index_version(), 1);
  ExpectSameAnswers(response, reference1, "version 1");

  // A caller's own pin goes to every shard as it is.
  SearchRequest pinned = request;
  pinned.set_index_version(99);
  SearchResponse refused_pin;
  grpc::Status bad_pin = CallSearch(*front.stub, pinned, &refused_pin);
  EXPECT_EQ(bad_pin.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(bad_pin.error_message(), HasSubstr("3 of 3 shards failed"));
  EXPECT_THAT(bad_pin.error_message(),
              HasSubstr("index_version=99 is not loaded here"));

  // Shard 0 swaps to version 2 and keeps version 1: still version 1.
  auto swap = [&](int s) {
    const std::string dir = tmp.path(absl::StrCat("shard-", s));
    ASSERT_TRUE(PublishVersion(dir, ShardPath(v2, s, kShards)).ok());
    ASSERT_TRUE(shards[s].server->index_manager().Reload().ok());
  };
  swap(0);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(search(&response).ok());
    EXPECT_EQ(response.index_version(), 1);
    ExpectSameAnswers(response, reference1, "version 1 pinned");
  }
  // Shard 1 swaps and keeps nothing: the pinned version 1 is gone there, so
  // calls fail (FAILED_PRECONDITION naming it) rather than mix versions.
  swap(1);
  grpc::Status refused = search(&response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("index_version=1 is not loaded here"));
  // Once every shard serves version 2, the front serves it.
  swap(2);
  const absl::Time end = absl::Now() + absl::Seconds(20);
  grpc::Status status;
  do {
    status = search(&response);
    if (status.ok() && response.index_version() == 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < end);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.index_version(), 2);
  ExpectSameAnswers(response, reference2, "version 2");
}

TEST(ShardFrontConfig, RefusesAnIndexBesideShardTargetsAndBadIntervals) {
  knnd::v1::ServerConfig config = TestConfig("/some/index");
  config.add_shard_targets("127.0.0.1:1");
  knnd::testing::ExpectConfigRefused(config, "exclude each other");
  config.clear_index_path();
  config.add_shard_targets("");
  knnd::testing::ExpectConfigRefused(config, "empty target");
  config.clear_shard_targets();
  config.add_shard_targets("127.0.0.1:1");
  config.set_shard_poll_interval_ms(10);
  knnd::testing::ExpectConfigRefused(config, "shard_poll_interval_ms=10");
  config.set_shard_poll_interval_ms(100);
  EXPECT_TRUE(ValidateConfig(config).ok());
}

}  // namespace
}  // namespace knnd
