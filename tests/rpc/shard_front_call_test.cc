// ShardFront::Call's way in (shard_front_call.cc): the front of shards takes
// the same SearchAdmission steps as knnd over one index, before it
// scatters anything; what it counts against its budget
// (shard_front_estimate.h) and holds its shards' answers to; and how it
// and knnd read a request whose filter nests too deep
// (search_request_codec.h). (Scatter, gather, merge, retries and partial
// results are shard_front_test.cc's.)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/rpc/search_admission.h"
#include "testing/deep_filter.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;
using knnd::testing::BuildIndex;
using knnd::testing::BuildSpec;
using knnd::testing::CallSearch;
using knnd::testing::FrontConfig;
using knnd::testing::MakeData;
using knnd::testing::MakeSearchRequest;
using knnd::testing::RunningServer;
using knnd::testing::StartServer;
using knnd::testing::TempDir;
using knnd::testing::TestConfig;
using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

double Rejected(const RunningServer& front, const std::string& reason) {
  return knnd::testing::FindSample(
             knnd::testing::Scrape(front.server->metrics_port()),
             "knnd_search_rejected_total", {{"reason", reason}})
      .value_or(-1);
}

// A front that has heard of no shard refuses at once, counted as not
// ready, and names the target it cannot reach.
TEST(ShardFrontCall, AFrontThatHeardOfNoShardRefusesAsNotReady) {
  const std::string nowhere =
      absl::StrCat("127.0.0.1:", knnd::testing::FreePort());
  RunningServer front = StartServer(FrontConfig({nowhere}));
  knnd::v1::SearchResponse response;
  // Until its first poll ends (a while on a slow, sanitized build) it says
  // it has polled nothing yet; then it names the target.
  grpc::Status status;
  int calls = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    if (calls > 0) absl::SleepFor(absl::Milliseconds(50));
    status = CallSearch(*front.stub, MakeSearchRequest(MakeData(1, 8, 1), 5),
                        &response);
    ++calls;
  } while (absl::StrContains(status.error_message(), "not been polled") &&
           absl::Now() < deadline);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr(nowhere));
  EXPECT_EQ(Rejected(front, "not_ready"), calls);
}

// The front checks the caller's token before anything else: an unknown one
// is UNAUTHENTICATED, not a rejection, and never reaches a shard.
TEST(ShardFrontCall, ACallWithoutTheTokenIsRefusedBeforeAnything) {
  TempDir tmp;
  const std::string tokens = tmp.path("search.tokens");
  knnd::testing::WriteFile(tokens, "front-search-token-0123\n");
  knnd::v1::ServerConfig config =
      FrontConfig({absl::StrCat("127.0.0.1:", knnd::testing::FreePort())});
  config.set_search_token_file(tokens);
  RunningServer front = StartServer(config);
  knnd::v1::SearchResponse response;
  grpc::Status status = CallSearch(
      *front.stub, MakeSearchRequest(MakeData(1, 8, 2), 5), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  for (const char* reason : {"not_ready", "queue_full", "deadline"}) {
    EXPECT_EQ(Rejected(front, reason), 0) << reason;
  }
}

// ---------------------------------------------------------------------------
// What the front counts and what it holds its shards to.

constexpr int kDim = 32;
constexpr int64_t kMiB = int64_t{1} << 20;

double Gauge(const RunningServer& server, const std::string& name) {
  return knnd::testing::FindSample(
             knnd::testing::Scrape(server.server->metrics_port()), name)
      .value_or(-1);
}

// Stands at a shard's address and passes its calls on to the real shard,
// changing what the test asks: its GetIndexInfo answers, its Search
// answers, or holding each Search until released. Counts the Searches.
class TamperingShard final : public knnd::v1::KnnService::Service {
 public:
  explicit TamperingShard(const RunningServer& real) : real_(real.stub.get()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.SetMaxSendMessageSize(-1);
    builder.SetMaxReceiveMessageSize(-1);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~TamperingShard() override {
    Release();
    server_->Shutdown();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int searches() const { return searches_.load(); }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

  std::function<void(GetIndexInfoResponse*)> change_info;
  std::function<void(SearchResponse*)> change_answer;
  bool hold = false;

  grpc::Status GetIndexInfo(grpc::ServerContext*,
                            const knnd::v1::GetIndexInfoRequest* request,
                            GetIndexInfoResponse* response) override {
    grpc::ClientContext context;
    grpc::Status status = real_->GetIndexInfo(&context, *request, response);
    if (change_info) change_info(response);
    return status;
  }
  grpc::Status Search(grpc::ServerContext*, const SearchRequest* request,
                      SearchResponse* response) override {
    ++searches_;
    if (hold) released_.WaitForNotificationWithTimeout(absl::Seconds(20));
    grpc::ClientContext context;
    grpc::Status status = real_->Search(&context, *request, response);
    if (change_answer) change_answer(response);
    return status;
  }

 private:
  knnd::v1::KnnService::Stub* const real_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> searches_{0};
  absl::Notification released_;
};

// Waits (at most 20 s) until `front` answers GetIndexInfo with `code` and
// a message holding `says`; returns its last status.
grpc::Status WaitForInfo(const RunningServer& front, grpc::StatusCode code,
                         const std::string& says = "") {
  const absl::Time end = absl::Now() + absl::Seconds(20);
  grpc::Status status;
  do {
    grpc::ClientContext context;
    GetIndexInfoResponse info;
    status = front.stub->GetIndexInfo(&context, {}, &info);
    if (status.error_code() == code &&
        absl::StrContains(status.error_message(), says)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < end);
  return status;
}

// An index of 3000 rows with vectors, attributes and payloads, split in
// two; row 7's payload is `large_payload` bytes of text, every other
// row's a few bytes.
class FrontBounds : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    index_ = tmp_->path("bounds.index");
    BuildSpec spec;
    spec.n = 3000;
    spec.d = kDim;
    spec.seed = 11;
    spec.factory = "IVF32,PQ32x4fs";
    spec.vectors = VectorsDtype::kFloat32;
    spec.attributes = knnd::testing::MakeAttributes(spec.n, 11);
    for (int64_t row = 0; row < spec.n; ++row) {
      spec.payloads.push_back(absl::StrCat(
          "{\"row\": ", row, ", \"text\": \"",
          std::string(row == 7 ? kLargePayload : 8, 'a'), "\"}"));
    }
    BuildIndex(index_, spec);
    ASSERT_TRUE(ShardIndexFile(index_, 2, index_, "test").ok());
  }
  static void TearDownTestSuite() { delete tmp_; }

  // A server of the whole index or of shard `s`, with the fixed
  // byte budget (not one derived from the machine's memory limit).
  static RunningServer Start(int s, int64_t max_inflight_bytes = 1 << 30) {
    knnd::v1::ServerConfig config =
        TestConfig(s < 0 ? index_ : ShardPath(index_, s, 2));
    config.set_max_inflight_bytes(static_cast<uint64_t>(max_inflight_bytes));
    return StartServer(config);
  }
  static RunningServer StartFront(const std::vector<std::string>& targets,
                                  int64_t max_inflight_bytes = 1 << 30) {
    knnd::v1::ServerConfig config = FrontConfig(targets);
    config.set_max_inflight_bytes(static_cast<uint64_t>(max_inflight_bytes));
    return StartServer(config);
  }

  static constexpr int kLargePayload = 32 << 10;
  static TempDir* tmp_;
  static std::string index_;
};

TempDir* FrontBounds::tmp_ = nullptr;
std::string FrontBounds::index_;

// k = 2^31 - 1 with refine_factor = 2^32 - 1 made the front's estimate
// wrap: a 32 MiB front admitted it, sent it on, and while it was in flight
// knnd_estimated_bytes_in_flight read negative (-2.06e11), so that other
// requests passed the budget. Now the front refuses it at once, naming
// the shards' limit, and nothing reaches a shard.
TEST_F(FrontBounds, AnEstimateThatWouldWrapIsRefusedBeforeAnythingIsSent) {
  RunningServer shard0 = Start(0);
  RunningServer shard1 = Start(1);
  TamperingShard held(shard0);
  held.hold = true;
  RunningServer front =
      StartFront({held.address(), shard1.address}, 32 * kMiB);
  ASSERT_TRUE(WaitForInfo(front, grpc::StatusCode::OK).ok());
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 3), 2147483647);
  request.set_refine_factor(4294967295u);
  grpc::Status status;
  std::atomic<bool> answered{false};
  std::thread call([&] {
    status = CallSearch(*front.stub, request);
    answered = true;
  });
  // Until the call is answered, or has reached the held shard.
  double lowest = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(10);
       absl::Now() < end && held.searches() == 0 && !answered;) {
    lowest = std::min(lowest, Gauge(front, "knnd_estimated_bytes_in_flight"));
    absl::SleepFor(absl::Milliseconds(20));
  }
  lowest = std::min(lowest, Gauge(front, "knnd_estimated_bytes_in_flight"));
  held.Release();
  call.join();
  EXPECT_EQ(held.searches(), 0);
  EXPECT_GE(lowest, 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("k=2147483647 exceeds max_k=1024 (the shards' limit)"));
  EXPECT_EQ(Gauge(front, "knnd_estimated_bytes_in_flight"), 0);
}

// A shard reporting max_payload_bytes = 2^62 made the front's estimate of
// a payload search wrap (2 shards x 1 entry x 2^62 = 2^63: negative), and
// the search was admitted with it. Now the front never counts with such a
// value: the shard is not ready, named, and a payload search is sized
// with the other shard's bound.
TEST_F(FrontBounds, AShardReportingAnImpossiblePayloadBoundIsNotCountedWith) {
  RunningServer shard0 = Start(0);
  RunningServer shard1 = Start(1);
  TamperingShard liar(shard0);
  liar.change_info = [](GetIndexInfoResponse* info) {
    info->set_max_payload_bytes(int64_t{1} << 62);
  };
  liar.hold = true;
  RunningServer front = StartFront({liar.address(), shard1.address});
  const std::string says = absl::StrCat(
      "target ", liar.address(),
      ": reports max_payload_bytes=4611686018427387904, outside [0, "
      "268435456]");
  const grpc::Status info =
      WaitForInfo(front, grpc::StatusCode::UNAVAILABLE, says);
  EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(info.error_message(), HasSubstr(says));
  SearchRequest request = MakeSearchRequest(MakeData(1, kDim, 4), 1);
  request.mutable_payloads()->set_all_fields(true);
  grpc::Status status;
  std::atomic<bool> answered{false};
  std::thread call([&] {
    status = CallSearch(*front.stub, request);
    answered = true;
  });
  for (const absl::Time end = absl::Now() + absl::Seconds(10);
       absl::Now() < end && liar.searches() == 0 && !answered;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Held at the liar: in flight with a true estimate.
  const double in_flight = Gauge(front, "knnd_estimated_bytes_in_flight");
  const int searches = liar.searches();
  liar.Release();
  call.join();
  EXPECT_EQ(searches, 1);
  EXPECT_GT(in_flight, 0);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A shard whose answers carry payloads larger than it reported (256 KiB
// against ~32 KiB) had them merged and forwarded: a 32 MiB front reached
// 68 MiB RssAnon. Now the answer is refused, naming the shard, and
// nothing of it is forwarded.
TEST_F(FrontBounds, AShardAnsweringLargerPayloadsThanItReportedIsRefused) {
  RunningServer shard0 = Start(0);
  RunningServer shard1 = Start(1);
  TamperingShard liar(shard0);
  const std::string large =
      absl::StrCat("{\"text\":\"", std::string(256 << 10, 'b'), "\"}");
  liar.change_answer = [&large](SearchResponse* answer) {
    for (std::string& payload : *answer->mutable_payloads()) payload = large;
  };
  RunningServer front = StartFront({liar.address(), shard1.address});
  ASSERT_TRUE(WaitForInfo(front, grpc::StatusCode::OK).ok());
  SearchRequest request = MakeSearchRequest(MakeData(2, kDim, 5), 5);
  request.mutable_payloads()->set_all_fields(true);
  SearchResponse response;
  grpc::Status status = CallSearch(*front.stub, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("shard 0 (", liar.address(),
                                     ") answered a payload of ", large.size(),
                                     " bytes")));
  EXPECT_THAT(status.error_message(), HasSubstr("it reported"));
  EXPECT_EQ(response.payloads_size(), 0);
  // Without payloads its answers are as good as ever.
  request.clear_payloads();
  EXPECT_TRUE(CallSearch(*front.stub, request).ok());
}

// 500 queries asking for payloads (largest row 32 KiB): the unsharded
// knnd answers them within its 1 GiB budget, and so does a front over
// the two shards, with the same answer (before, the front estimated
// 3,373,164,880 bytes and refused: INVALID_ARGUMENT "more than
// max_inflight_bytes=1073741824").
TEST_F(FrontBounds, AFrontAnswersThePayloadRequestsOneKnndAnswers) {
  RunningServer whole = Start(-1);
  RunningServer shard0 = Start(0);
  RunningServer shard1 = Start(1);
  RunningServer front = StartFront({shard0.address, shard1.address});
  ASSERT_TRUE(WaitForInfo(front, grpc::StatusCode::OK).ok());
  SearchRequest request = MakeSearchRequest(MakeData(500, kDim, 6), 10);
  request.set_nprobe(4);
  request.set_refine_factor(10);
  request.mutable_payloads()->set_all_fields(true);
  SearchResponse from_whole;
  SearchResponse from_front;
  grpc::Status a = CallSearch(*whole.stub, request, &from_whole);
  grpc::Status b = CallSearch(*front.stub, request, &from_front);
  ASSERT_TRUE(a.ok()) << a.error_message();
  ASSERT_TRUE(b.ok()) << b.error_message();
  ASSERT_EQ(from_front.ids_size(), from_whole.ids_size());
  ASSERT_EQ(from_front.payloads_size(), from_front.ids_size());
  // Equal answers up to the order of equal distances: each id's payload
  // is the unsharded index's.
  std::map<int64_t, std::string> payload_of;
  for (int i = 0; i < from_whole.ids_size(); ++i) {
    payload_of[from_whole.ids(i)] = from_whole.payloads(i);
  }
  int same = 0;
  for (int i = 0; i < from_front.ids_size(); ++i) {
    EXPECT_EQ(from_front.distances(i), from_whole.distances(i)) << i;
    auto it = payload_of.find(from_front.ids(i));
    if (it == payload_of.end()) continue;
    ++same;
    EXPECT_EQ(from_front.payloads(i), it->second) << from_front.ids(i);
  }
  EXPECT_GT(same, from_front.ids_size() * 9 / 10);
}

// ---------------------------------------------------------------------------
// Filters nested too deep, through real servers: an unsharded knnd, a
// shard, and a front (which refuses what it cannot read itself and relays
// the shards' refusal of what it can).

grpc::Status SearchBytes(const RunningServer& server, const std::string& bytes) {
  grpc::GenericStub stub(server.channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/knnd.v1.KnnService/Search", request,
                            &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Before: a filter nested ~100 deep got INTERNAL "Unable to parse
// request" from gRPC (protobuf's recursion limit of 100), never knnd's
// own INVALID_ARGUMENT naming max_filter_depth.
TEST_F(FrontBounds, DeepFiltersAreRefusedNamingTheLimit) {
  RunningServer whole = Start(-1);
  RunningServer shard0 = Start(0);
  RunningServer shard1 = Start(1);
  RunningServer front = StartFront({shard0.address, shard1.address});
  ASSERT_TRUE(WaitForInfo(front, grpc::StatusCode::OK).ok());
  const SearchRequest plain = MakeSearchRequest(MakeData(2, kDim, 7), 5);
  const int64_t deepest = knnd::testing::DeepestWithin(plain, 4 << 20);
  struct Case {
    int64_t depth;
    knnd::testing::Nesting nesting;
    const char* says;
  };
  const Case cases[] = {
      {16, knnd::testing::Nesting::kAllOf, nullptr},  // at the limit: served
      {100, knnd::testing::Nesting::kNegate, "filter is nested 100 deep"},
      {200, knnd::testing::Nesting::kAllOf, "filter is nested 200 deep"},
      {deepest, knnd::testing::Nesting::kNegate,
       "filter is nested more than 256 deep"},
  };
  for (const Case& c : cases) {
    const std::string bytes = knnd::testing::WithFilterBytes(
        plain, knnd::testing::DeepFilterBytes(c.depth, c.nesting));
    ASSERT_LE(bytes.size(), size_t{4} << 20);
    for (const RunningServer* server : {&whole, &shard0, &front}) {
      const std::string what =
          absl::StrCat(server->address, ": depth ", c.depth);
      const grpc::Status status = SearchBytes(*server, bytes);
      if (c.says == nullptr) {
        EXPECT_TRUE(status.ok()) << what << ": " << status.error_message();
        continue;
      }
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << what << ": " << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(c.says)) << what;
      EXPECT_THAT(status.error_message(), HasSubstr("max_filter_depth=16"))
          << what;
    }
  }
}

}  // namespace
}  // namespace knnd
