// ShardFront::Call's way in (shard_front_call.cc): the front of shards takes
// the same SearchAdmission steps as knnd over one index, before it
// scatters anything. (Scatter, gather, merge, retries and partial results
// are shard_front_test.cc's.)
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/rpc/search_admission.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;
using knnd::testing::CallSearch;
using knnd::testing::FrontConfig;
using knnd::testing::MakeData;
using knnd::testing::MakeSearchRequest;
using knnd::testing::RunningServer;
using knnd::testing::StartServer;
using knnd::testing::TempDir;
using knnd::testing::TestConfig;

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

}  // namespace
}  // namespace knnd
