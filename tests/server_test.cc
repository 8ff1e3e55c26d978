// Server (src/server.cc) end to end through gRPC, in process: answers
// equal FAISS's, every bad input's status, the gate's pushback, health
// while loading and draining, warm-up, the FAISS knobs it sets, and the
// heap check and byte budget it derives from a memory limit.
#include "knnd/server.h"

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <faiss/IndexIVF.h>
#include <faiss/utils/distances.h>

#include "absl/strings/str_cat.h"
#include "knnd/config/config.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/lifecycle/index_source.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CallSearch;
using ::knnd::testing::CheckHealth;
using ::knnd::testing::FreePort;
using ::knnd::testing::FreshChannel;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::MakeSearchRequest;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::RunningServer;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

class ServerTest : public ::testing::TestWithParam<bool> {};

// Results over gRPC equal FAISS's own search of the same file, for one and
// for a hundred queries, L2 (param false) and inner product (true).
TEST_P(ServerTest, ResultsEqualDirectFaissSearch) {
  TempDir tmp;
  IndexSpec spec;
  spec.inner_product = GetParam();
  WriteIndex(tmp.path("s.index"), spec);
  RunningServer s = StartServer(TestConfig(tmp.path("s.index")));
  ASSERT_NE(s.stub, nullptr);
  for (int nq : {1, 100}) {
    for (int nprobe : {2, 16}) {
      std::vector<float> q = MakeData(nq, spec.d, 31);
      auto request = MakeSearchRequest(q, 10);
      request.set_nprobe(nprobe);
      knnd::v1::SearchResponse response;
      grpc::Status status = CallSearch(*s.stub, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      std::vector<float> want_d;
      std::vector<int64_t> want_i;
      ReferenceSearch(tmp.path("s.index"), q, 10, nprobe, &want_d, &want_i);
      EXPECT_EQ(std::vector<int64_t>(response.ids().begin(),
                                     response.ids().end()),
                want_i)
          << "nq=" << nq << " nprobe=" << nprobe;
      EXPECT_EQ(response.num_queries(), static_cast<uint32_t>(nq));
      EXPECT_EQ(response.k(), 10);
      EXPECT_EQ(response.nprobe(), static_cast<uint32_t>(nprobe));
      EXPECT_EQ(response.index_version(), 1);
      EXPECT_EQ(response.metric(), spec.inner_product
                                       ? knnd::v1::METRIC_INNER_PRODUCT
                                       : knnd::v1::METRIC_L2);
      // The raw-bytes form gives the same answer.
      knnd::v1::SearchRequest raw;
      raw.set_k(10);
      raw.set_nprobe(nprobe);
      raw.set_dim(spec.d);
      raw.set_vectors_f32le(std::string(
          reinterpret_cast<const char*>(q.data()), q.size() * sizeof(float)));
      knnd::v1::SearchResponse raw_response;
      ASSERT_TRUE(CallSearch(*s.stub, raw, &raw_response).ok());
      EXPECT_THAT(raw_response.ids(), ::testing::ElementsAreArray(response.ids()));

      // float16 and bfloat16 queries get the answer of their values sent
      // as float32 (the server widens them exactly).
      for (const bool bf16 : {false, true}) {
        std::string words;
        std::vector<float> widened;
        for (const float v : q) {
          uint16_t w;
          if (bf16) {
            uint32_t bits;
            std::memcpy(&bits, &v, sizeof(bits));
            w = static_cast<uint16_t>(bits >> 16);  // truncated: a bfloat16
            const uint32_t back = uint32_t{w} << 16;
            float f;
            std::memcpy(&f, &back, sizeof(f));
            widened.push_back(f);
          } else {
            w = FloatToHalf(v);
            widened.push_back(HalfToFloat(w));
          }
          words.push_back(static_cast<char>(w & 0xff));
          words.push_back(static_cast<char>(w >> 8));
        }
        knnd::v1::SearchRequest as_floats = raw;
        as_floats.set_vectors_f32le(
            std::string(reinterpret_cast<const char*>(widened.data()),
                        widened.size() * sizeof(float)));
        knnd::v1::SearchRequest as_words = raw;
        as_words.clear_vectors_f32le();
        if (bf16) {
          as_words.set_vectors_bf16le(words);
        } else {
          as_words.set_vectors_f16le(words);
        }
        knnd::v1::SearchResponse from_floats, from_words;
        ASSERT_TRUE(CallSearch(*s.stub, as_floats, &from_floats).ok());
        ASSERT_TRUE(CallSearch(*s.stub, as_words, &from_words).ok());
        EXPECT_EQ(from_words.num_queries(), static_cast<uint32_t>(nq));
        EXPECT_THAT(from_words.ids(),
                    ::testing::ElementsAreArray(from_floats.ids()))
            << (bf16 ? "bf16" : "f16");
        EXPECT_THAT(from_words.distances(),
                    ::testing::ElementsAreArray(from_floats.distances()))
            << (bf16 ? "bf16" : "f16");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ByMetric, ServerTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "InnerProduct" : "L2";
                         });

class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteIndex(tmp_.path("s.index"), spec_);
    config_ = TestConfig(tmp_.path("s.index"));
    config_.set_max_k(50);
    config_.set_max_queries_per_request(20);
    config_.set_max_nprobe(16);
    config_.set_max_filter_ids(8);
    config_.set_max_receive_message_bytes(64 * 1024);
  }
  TempDir tmp_;
  IndexSpec spec_;
  knnd::v1::ServerConfig config_;
};

// A message larger than the byte budget (plus 64 KiB of framing) could
// never be admitted: gRPC refuses it from its length prefix, with
// max_receive_message_bytes itself far above it, and the server keeps
// serving.
TEST_F(ServerFixture, MessagesLargerThanTheByteBudgetAreRefusedByGrpc) {
  config_.set_max_receive_message_bytes(64 << 20);
  config_.set_max_queries_per_request(100000);
  config_.set_max_inflight_queries(100000);
  config_.set_max_inflight_bytes(1 << 20);
  RunningServer s = StartServer(config_);
  knnd::v1::SearchRequest big;
  big.set_k(5);
  big.set_vectors_f32le(std::string((1 << 20) + (64 << 10) + 4 * 32, 'a'));
  knnd::v1::SearchResponse response;
  grpc::Status status = CallSearch(*s.stub, big, &response);
  EXPECT_EQ(status.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("larger than max"));
  // Under the limit, the same kind of request reaches knnd's own check.
  big.set_vectors_f32le(std::string((1 << 20) - 4 * 32 * 10, 'a'));
  status = CallSearch(*s.stub, big, &response);
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT)
      << status.error_message();
  const std::vector<float> one = MakeData(1, spec_.d, 3);
  knnd::v1::SearchResponse good;
  ASSERT_TRUE(CallSearch(*s.stub, MakeSearchRequest(one, 5), &good).ok());
  EXPECT_EQ(good.ids_size(), 5);
}

TEST_F(ServerFixture, EveryBadInputGetsItsStatusAndTheServerKeepsServing) {
  RunningServer s = StartServer(config_);
  const std::vector<float> one = MakeData(1, spec_.d, 3);
  struct Case {
    std::string name;
    knnd::v1::SearchRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, knnd::v1::SearchRequest r,
                 grpc::StatusCode code, std::string message) {
    cases.push_back({std::move(name), std::move(r), code, std::move(message)});
  };
  {
    auto r = MakeSearchRequest(one, 5);
    r.set_dim(16);
    add("wrong dim", r, grpc::INVALID_ARGUMENT,
        "dim=16 does not match the index dimension 32");
  }
  add("no queries", MakeSearchRequest({}, 5), grpc::INVALID_ARGUMENT,
      "no queries");
  add("too many queries", MakeSearchRequest(MakeData(21, spec_.d, 3), 5),
      grpc::INVALID_ARGUMENT, "num_queries=21 exceeds max_queries_per_request=20");
  add("k zero", MakeSearchRequest(one, 0), grpc::INVALID_ARGUMENT,
      "k=0 must be positive");
  add("k too big", MakeSearchRequest(one, 51), grpc::INVALID_ARGUMENT,
      "k=51 exceeds max_k=50");
  {
    auto r = MakeSearchRequest(one, 5);
    r.set_nprobe(17);
    add("nprobe", r, grpc::INVALID_ARGUMENT, "nprobe=17 is outside [1, 16]");
  }
  {
    auto r = MakeSearchRequest(one, 5);
    r.set_vectors(3, std::nanf(""));
    add("nan", r, grpc::INVALID_ARGUMENT, "query 0 has a non-finite value");
  }
  {
    knnd::v1::SearchRequest r;
    r.set_k(5);
    r.set_vectors_f32le(std::string(4 * 32 + 2, 'a'));
    add("bytes", r, grpc::INVALID_ARGUMENT,
        "vectors_f32le has 130 bytes, not a multiple of 4*dim=128");
  }
  {
    knnd::v1::SearchRequest r;
    r.set_k(5);
    r.set_vectors_f16le(std::string(2 * 32 + 1, 'a'));
    add("half bytes", r, grpc::INVALID_ARGUMENT,
        "vectors_f16le has 65 bytes, not a multiple of 2*dim=64");
  }
  {
    knnd::v1::SearchRequest r;
    r.set_k(5);
    std::string words(2 * 32, '\0');
    words[2 * 5 + 1] = static_cast<char>(0x7f);  // 0x7f80: +inf
    words[2 * 5] = static_cast<char>(0x80);
    r.set_vectors_bf16le(words);
    add("bfloat16 inf", r, grpc::INVALID_ARGUMENT,
        "query 0 has a non-finite value (inf) at dimension 5");
  }
  {
    auto r = MakeSearchRequest(one, 5);
    r.set_vectors_f16le(std::string(2 * 32, '\0'));
    add("two encodings", r, grpc::INVALID_ARGUMENT,
        "not vectors and vectors_f16le");
  }
  {
    auto r = MakeSearchRequest(one, 5);
    for (int i = 0; i < 9; ++i) r.add_allowed_ids(i);
    add("filter", r, grpc::INVALID_ARGUMENT,
        "allowed_ids has 9 ids, more than max_filter_ids=8");
  }
  {
    knnd::v1::SearchRequest r;
    r.set_k(5);
    r.set_vectors_f32le(std::string(70 * 1024, 'a'));
    add("message size", r, grpc::RESOURCE_EXHAUSTED, "larger than max");
  }
  for (const Case& c : cases) {
    knnd::v1::SearchResponse response;
    grpc::Status status = CallSearch(*s.stub, c.request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": "
                                           << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
    // And a good request still works.
    knnd::v1::SearchResponse good;
    ASSERT_TRUE(CallSearch(*s.stub, MakeSearchRequest(one, 5), &good).ok())
        << "after " << c.name;
    EXPECT_EQ(good.ids_size(), 5);
  }
}

TEST_F(ServerFixture, FullGateAnswersResourceExhaustedWithPushback) {
  config_.set_max_inflight_queries(20);
  config_.set_retry_pushback_ms(75);
  RunningServer s = StartServer(config_);
  // Hold the whole budget, as 20 queued queries would.
  auto held = s.server->gate().TryAdmit(20, 0);
  ASSERT_TRUE(held.ok());
  grpc::ClientContext context;
  knnd::v1::SearchResponse response;
  grpc::Status status =
      CallSearch(*s.stub, MakeSearchRequest(MakeData(1, spec_.d, 3), 5),
                 &response, &context);
  EXPECT_EQ(status.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_inflight_queries=20"));
  auto pushback = context.GetServerTrailingMetadata().find(
      "grpc-retry-pushback-ms");
  ASSERT_NE(pushback, context.GetServerTrailingMetadata().end());
  EXPECT_EQ(std::string(pushback->second.data(), pushback->second.size()),
            "75");
  held->Release();
  knnd::v1::SearchResponse ok;
  EXPECT_TRUE(
      CallSearch(*s.stub, MakeSearchRequest(MakeData(1, spec_.d, 3), 5), &ok)
          .ok());
}

TEST_F(ServerFixture, ExpiredDeadlineIsRefusedWithoutSearching) {
  RunningServer s = StartServer(config_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() -
                       std::chrono::seconds(1));
  knnd::v1::SearchResponse response;
  grpc::Status status =
      CallSearch(*s.stub, MakeSearchRequest(MakeData(1, spec_.d, 3), 5),
                 &response, &context);
  EXPECT_EQ(status.error_code(), grpc::DEADLINE_EXCEEDED);
}

TEST_F(ServerFixture, AllowListReturnsOnlyAllowedIds) {
  RunningServer s = StartServer(config_);
  auto r = MakeSearchRequest(MakeData(5, spec_.d, 12), 6);
  const std::set<int64_t> allowed = {11, 222, 3333, 4000, 4999};
  for (int64_t id : allowed) r.add_allowed_ids(id);
  r.set_nprobe(16);
  knnd::v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(*s.stub, r, &response).ok());
  ASSERT_EQ(response.ids_size(), 30);
  for (int i = 0; i < 30; ++i) {
    const int64_t id = response.ids(i);
    if (id == -1) continue;  // fewer allowed ids in the probed lists than k
    EXPECT_TRUE(allowed.count(id)) << "id " << id << " is not allowed";
  }
}

TEST_F(ServerFixture, GetIndexInfoReportsIndexAndLimits) {
  RunningServer s = StartServer(config_);
  grpc::ClientContext context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(s.stub->GetIndexInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.dim(), 32u);
  EXPECT_EQ(info.ntotal(), spec_.n);
  EXPECT_EQ(info.nlist(), 32u);
  EXPECT_EQ(info.pq_m(), 8u);
  EXPECT_EQ(info.code_size_bytes(), 8u);
  EXPECT_EQ(info.metric(), knnd::v1::METRIC_L2);
  EXPECT_EQ(info.index_type(), "IVF32,PQ8");
  EXPECT_EQ(info.version(), 1);
  EXPECT_EQ(info.default_nprobe(), 4u);  // saved in the file
  EXPECT_EQ(info.max_nprobe(), 16u);
  EXPECT_EQ(info.max_k(), 50);
  EXPECT_EQ(info.max_queries_per_request(), 20u);
  EXPECT_EQ(info.max_filter_ids(), 8u);
  EXPECT_GT(info.file_bytes(), spec_.n * 16);
  EXPECT_GT(info.heap_bytes(), 0);
  EXPECT_GT(info.load_time_unix_seconds(), 1.7e9);
}

TEST_F(ServerFixture, HealthIsNotServingUntilLoadedThenNotServingWhenDraining) {
  auto server = Server::Create(config_);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->Start().ok());
  auto channel = grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->port()),
      grpc::InsecureChannelCredentials());
  using R = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(CheckHealth(channel, ""), R::NOT_SERVING);
  EXPECT_EQ(CheckHealth(channel, "knnd.v1.KnnService"), R::NOT_SERVING);
  // Before the index is loaded, searches are UNAVAILABLE.
  auto stub = knnd::v1::KnnService::NewStub(channel);
  {
    auto status = CallSearch(*stub, MakeSearchRequest(MakeData(1, 32, 1), 1));
    EXPECT_EQ(status.error_code(), grpc::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), HasSubstr("not loaded"));
  }
  ASSERT_TRUE((*server)->LoadIndex().ok());
  EXPECT_EQ(CheckHealth(channel, ""), R::SERVING);
  EXPECT_EQ(CheckHealth(channel, "knnd.v1.KnnService"), R::SERVING);
  // Hold a request's share so that the drain has to wait; meanwhile health
  // says NOT_SERVING and new searches are UNAVAILABLE.
  auto held = (*server)->gate().TryAdmit(1, 0);
  ASSERT_TRUE(held.ok());
  knnd::Server::DrainPlan plan;
  plan.grace = absl::Seconds(30);
  std::thread drainer([&] { (*server)->Drain(plan); });
  while (!(*server)->gate().draining()) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(CheckHealth(channel, ""), R::NOT_SERVING);
  {
    auto status = CallSearch(*stub, MakeSearchRequest(MakeData(1, 32, 1), 1));
    EXPECT_EQ(status.error_code(), grpc::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), HasSubstr("draining"));
  }
  held->Release();
  drainer.join();
}

// The shutdown delay: health NOT_SERVING at once while the port stays open;
// searches are still served (the default) or refused UNAVAILABLE "knnd is
// shutting down"; EndShutdownDelay() (a second signal) ends it, and the
// drain closes the port.
TEST_F(ServerFixture, ShutdownDelayServesOrRefusesWhileNotServing) {
  for (const bool refuse : {false, true}) {
    SCOPED_TRACE(refuse ? "refusing" : "serving");
    auto server = Server::Create(config_);
    ASSERT_TRUE(server.ok());
    ASSERT_TRUE((*server)->Start().ok());
    ASSERT_TRUE((*server)->LoadIndex().ok());
    const std::string address =
        "127.0.0.1:" + std::to_string((*server)->port());
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    using R = grpc::health::v1::HealthCheckResponse;
    ASSERT_EQ(CheckHealth(channel, "knnd.v1.KnnService"), R::SERVING);
    Server::DrainPlan plan;
    plan.delay = absl::Hours(1);  // ended below
    plan.refuse_during_delay = refuse;
    plan.grace = absl::Seconds(30);
    bool idle = false;
    std::thread drainer([&] { idle = (*server)->Drain(plan); });
    while (CheckHealth(channel, "knnd.v1.KnnService") != R::NOT_SERVING) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(CheckHealth(channel, ""), R::NOT_SERVING);
    auto stub = knnd::v1::KnnService::NewStub(channel);
    const grpc::Status search =
        CallSearch(*stub, MakeSearchRequest(MakeData(1, 32, 1), 1));
    if (refuse) {
      EXPECT_EQ(search.error_code(), grpc::UNAVAILABLE);
      EXPECT_THAT(search.error_message(), HasSubstr("knnd is shutting down"));
    } else {
      EXPECT_TRUE(search.ok()) << search.error_message();
    }
    (*server)->EndShutdownDelay();
    drainer.join();
    EXPECT_TRUE(idle);
    // Closed: a new connection is refused.
    auto after = knnd::v1::KnnService::NewStub(FreshChannel(address));
    EXPECT_EQ(CallSearch(*after, MakeSearchRequest(MakeData(1, 32, 1), 1))
                  .error_code(),
              grpc::UNAVAILABLE);
  }
}

// warmup_nprobe: each warm-up query reads that many lists (FAISS's IVF
// statistics count the non-empty lists a search visits), so that the
// warm-up before SERVING does not scan most of a large index; 0 means the
// default nprobe, and a value above nlist reads every list once.
TEST(WarmUp, ReadsWarmupNprobeListsPerQuery) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 4000;
  spec.factory = "IVF16,PQ8";
  WriteIndex(tmp.path("w.index"), spec);
  constexpr int kQueries = 12;
  for (const auto& [warmup_nprobe, lists] :
       std::vector<std::pair<int, int>>{{1, 1}, {3, 3}, {0, 8}, {64, 16}}) {
    knnd::v1::ServerConfig config = TestConfig(tmp.path("w.index"));
    config.set_warmup_queries(kQueries);
    config.set_warmup_nprobe(warmup_nprobe);
    config.set_default_nprobe(8);
    faiss::indexIVF_stats.reset();
    RunningServer s = StartServer(config);  // no search but the warm-up yet
    ASSERT_NE(s.stub, nullptr);
    EXPECT_EQ(faiss::indexIVF_stats.nq, static_cast<size_t>(kQueries))
        << "warmup_nprobe " << warmup_nprobe;
    EXPECT_EQ(faiss::indexIVF_stats.nlist,
              static_cast<size_t>(kQueries * lists))
        << "warmup_nprobe " << warmup_nprobe;
  }
}

// The default malloc_mmap_threshold_bytes (1 MiB) sizes FAISS's coarse
// distance block under it: 128 query rows x 1024 centroids x 4 bytes
// (IndexSnapshot.CoarseSearchBlockUnderTheMmapThresholdStopsPageFaults shows
// why); 0 leaves FAISS's 4096 rows.
TEST(ServerMalloc, CoarseBlockFollowsTheMmapThreshold) {
  TempDir tmp;
  WriteIndex(tmp.path("m.index"), IndexSpec{});
  const int faiss_default = faiss::distance_compute_blas_query_bs;
  knnd::v1::ServerConfig config = TestConfig(tmp.path("m.index"));
  ASSERT_EQ(config.malloc_mmap_threshold_bytes(), 1u << 20);
  auto server = Server::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(faiss::distance_compute_blas_query_bs, 128);
  faiss::distance_compute_blas_query_bs = faiss_default;
  config.set_malloc_mmap_threshold_bytes(0);
  server = Server::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(faiss::distance_compute_blas_query_bs, faiss_default);
}

// IVF<nlist>,PQ<m> over 6000 vectors of 32 dimensions: a precomputed table
// of nlist * m * 256 * 4 bytes.
IndexSpec TableSpec(int64_t nlist, int m) {
  IndexSpec spec;
  spec.n = 6000;
  spec.d = 32;
  spec.factory = absl::StrCat("IVF", nlist, ",PQ", m);
  return spec;
}

TEST(IndexHeapCheck, StartUpIsRefusedWhenTheHeapNeedExceedsTheLimit) {
  TempDir tmp;
  WriteIndex(tmp.path("a.index"), TableSpec(128, 16));  // table 2 MiB
  knnd::v1::ServerConfig config = TestConfig(tmp.path("a.index"));
  config.set_memory_limit_bytes(1 << 20);
  config.set_memory_headroom_bytes(0);
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto server = Server::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Start().ok());
  absl::Status loaded = (*server)->LoadIndex();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kResourceExhausted) << loaded;
  EXPECT_THAT(std::string(loaded.message()),
              HasSubstr("more than the memory limit of 1.0 MiB"));
  EXPECT_THAT(std::string(loaded.message()),
              HasSubstr("use_precomputed_table: false (saves 2.0 MiB)"));
  EXPECT_EQ((*server)->holder().Pin(), nullptr);

  // Without the table the same index fits, and the byte budget becomes half
  // of what the limit leaves.
  config.set_use_precomputed_table(false);
  config.set_metrics_listen_address(
      absl::StrCat("127.0.0.1:", FreePort()));
  RunningServer lean = StartServer(config);
  ASSERT_NE(lean.server, nullptr);
  auto snapshot = lean.server->holder().Pin();
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(lean.server->gate().max_inflight_bytes(),
            ((1 << 20) - snapshot->info().heap_bytes) / 100 * 50);
}

TEST(IndexHeapCheck, ExplicitMaxInflightBytesWinsOverTheLimitShare) {
  TempDir tmp;
  WriteIndex(tmp.path("a.index"), TableSpec(16, 4));
  knnd::v1::ServerConfig config = TestConfig(tmp.path("a.index"));
  config.set_memory_limit_bytes(64 << 20);
  config.set_memory_headroom_bytes(0);
  config.set_max_inflight_bytes(12345678);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  EXPECT_EQ(s.server->gate().max_inflight_bytes(), 12345678);
}

TEST(IndexHeapCheck, HotSwapToAVersionThatDoesNotFitKeepsTheOldOneServing) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  WriteIndex(tmp.path("v1.index"), TableSpec(16, 4));    // table 64 KiB
  WriteIndex(tmp.path("v2.index"), TableSpec(256, 16));  // table 4 MiB
  ASSERT_TRUE(PublishVersion(dir, tmp.path("v1.index")).ok());
  knnd::v1::ServerConfig config = TestConfig(dir);
  config.set_memory_limit_bytes(2 << 20);
  config.set_memory_headroom_bytes(0);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  const int64_t budget = s.server->gate().max_inflight_bytes();
  ASSERT_TRUE(PublishVersion(dir, tmp.path("v2.index")).ok());
  auto reload = s.server->index_manager().Reload();
  EXPECT_EQ(reload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reload.status().message()),
              HasSubstr("still serving version 1"));
  EXPECT_THAT(std::string(reload.status().message()),
              HasSubstr("more than the memory limit"));
  EXPECT_EQ(s.server->holder().Pin()->info().version, 1);
  EXPECT_EQ(s.server->gate().max_inflight_bytes(), budget);
}

}  // namespace
}  // namespace knnd
