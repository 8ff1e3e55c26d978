// The background checksum check (checksum_check "background"): the verifier
// itself, and through an in-process server, where the first version serves
// at once and is withdrawn when its files turn out changed, and later
// versions are verified before serving.
#include "knnd/lifecycle/checksum_verifier.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/lifecycle/index_manager.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

using ::knnd::testing::ChecksumState;
using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::Request;
using ::knnd::testing::RunningServer;
using ::knnd::testing::Scrape;
using ::knnd::testing::ServedVersion;
using ::knnd::testing::ServeVersionOne;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::VersionSpec;
using ::testing::HasSubstr;

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    RunningServer& s) {
  auto stub = grpc::health::v1::Health::NewStub(s.channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("knnd.v1.KnnService");
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

// checksum_check "background" (the default): the first version serves before
// its file is read whole; the background check then finds the changed byte
// and withdraws it (searches UNAVAILABLE with the reason, health
// NOT_SERVING, the version refused) until a good version is published.
TEST(ChecksumVerifier, WithdrawsAChangedFirstVersion) {
  using grpc::health::v1::HealthCheckResponse;
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  PublishIndex(tmp, dir, VersionSpec(1));
  FlipByteFromEnd(dir + "/1/index.faiss", 4);  // of the last id
  knnd::v1::ServerConfig config = TestConfig(dir);
  ASSERT_EQ(config.checksum_check(), "background");
  RunningServer s = StartServer(config);  // LoadIndex() succeeded
  ASSERT_NE(s.stub, nullptr);
  IndexManager& manager = s.server->index_manager();

  const absl::Status check =
      manager.AwaitBackgroundCheck(absl::Now() + absl::Seconds(60));
  EXPECT_EQ(check.code(), absl::StatusCode::kDataLoss) << check;
  EXPECT_THAT(check.message(), HasSubstr("index version 1"));
  EXPECT_THAT(check.message(), HasSubstr("withdrawn"));
  EXPECT_THAT(check.message(), HasSubstr("CRC-32"));
  EXPECT_THAT(check.message(), HasSubstr(dir + "/1/index.faiss.meta.json"));
  EXPECT_EQ(Health(s), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Scrape(s, "knnd_index_serving"), 0);
  EXPECT_EQ(ChecksumState(s), "failed");
  knnd::v1::SearchResponse response;
  grpc::ClientContext context;
  grpc::Status status = s.stub->Search(&context, Request(7), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("withdrawn"));
  EXPECT_THAT(status.error_message(), HasSubstr("CRC-32"));
  absl::StatusOr<std::vector<IndexManager::VersionState>> versions =
      manager.ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 1u);
  EXPECT_FALSE((*versions)[0].serving);
  EXPECT_TRUE((*versions)[0].refused);
  EXPECT_THAT((*versions)[0].refused_reason, HasSubstr("CRC-32"));

  // A good version serves again, verified before it is published.
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  absl::StatusOr<IndexManager::Outcome> outcome = manager.Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_EQ(Health(s), HealthCheckResponse::SERVING);
  EXPECT_EQ(Scrape(s, "knnd_index_serving"), 1);
  EXPECT_EQ(ChecksumState(s), "verified");
}

// After start-up, "background" verifies before publishing: a changed file
// is refused and the version serving keeps serving. A good first version
// passes its background check and keeps serving.
TEST(ChecksumVerifier, VerifiesHotSwapsFirst) {
  using grpc::health::v1::HealthCheckResponse;
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  IndexManager& manager = s.server->index_manager();
  EXPECT_TRUE(
      manager.AwaitBackgroundCheck(absl::Now() + absl::Seconds(60)).ok());
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Health(s), HealthCheckResponse::SERVING);
  EXPECT_EQ(Scrape(s, "knnd_index_serving"), 1);
  EXPECT_EQ(ChecksumState(s), "verified");

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  FlipByteFromEnd(dir + "/2/index.faiss", 4);
  absl::StatusOr<IndexManager::Outcome> outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(outcome.status().message(), HasSubstr("CRC-32"));
  EXPECT_THAT(outcome.status().message(), HasSubstr("still serving version 1"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Health(s), HealthCheckResponse::SERVING);
}

// ChecksumVerifier itself, on versions loaded without their files read
// whole: none started is done at once; a started check reads the files on
// a thread of its own and hands its outcome to the callback there: OK for
// an unchanged file, DATA_LOSS naming the file for a changed one.
TEST(ChecksumVerifier, ReadsTheFilesOnItsOwnThread) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  FlipByteFromEnd(dir + "/2/index.faiss", 4);
  LoadOptions unread;
  unread.verify_checksum = false;

  ChecksumVerifier none;
  EXPECT_FALSE(none.started());
  none.AwaitRead();
  EXPECT_TRUE(none.AwaitDone(absl::Now()).ok());

  for (int64_t version : {1, 2}) {
    const std::string path = absl::StrCat(dir, "/", version, "/index.faiss");
    std::shared_ptr<const IndexSnapshot> snapshot = LoadSnapshot(path, unread);
    ASSERT_NE(snapshot, nullptr) << path;
    ChecksumVerifier verifier;
    absl::Status outcome = absl::UnknownError("no callback");
    std::thread::id ran_on;
    verifier.Start(snapshot, [&](const absl::Status& status) {
      outcome = status;
      ran_on = std::this_thread::get_id();
    });
    EXPECT_TRUE(verifier.started());
    const absl::Status done =
        verifier.AwaitDone(absl::Now() + absl::Seconds(60));
    verifier.AwaitRead();
    EXPECT_EQ(done, outcome);
    EXPECT_NE(ran_on, std::this_thread::get_id());
    if (version == 1) {
      EXPECT_TRUE(done.ok()) << done;
    } else {
      EXPECT_EQ(done.code(), absl::StatusCode::kDataLoss) << done;
      EXPECT_THAT(done.message(), HasSubstr(path));
      EXPECT_THAT(done.message(), HasSubstr("CRC-32"));
    }
  }
}

}  // namespace
}  // namespace knnd
