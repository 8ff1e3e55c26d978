// AdminService through an in-process server: its own listener, ReloadIndex
// (refusals, pinning, unpinning) and ListVersions; and the service on a
// listener of its own over an IndexManager whose reload the test holds,
// for the limit on admin calls waiting or running.
#include "knnd/rpc/admin_service.h"

#include <chrono>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "knnd/lifecycle/index_manager.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/index_holder.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

using ::knnd::testing::AdminStub;
using ::knnd::testing::IdleMetrics;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::Reloads;
using ::knnd::testing::ReloadRpc;
using ::knnd::testing::Request;
using ::knnd::testing::RunningServer;
using ::knnd::testing::ServedVersion;
using ::knnd::testing::ServeVersionOne;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::VersionSpec;
using ::testing::HasSubstr;

// The admin API listens on its own address, unless configured onto the
// search port or off; neither port answers the other's service.
TEST(AdminService, ListensApartFromTheSearchApiUnlessConfigured) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  ASSERT_NE(s.server->admin_port(), 0);
  ASSERT_NE(s.server->admin_port(), s.server->port());

  knnd::v1::ReloadIndexResponse reloaded;
  auto on_search_port = knnd::v1::AdminService::NewStub(s.channel);
  EXPECT_EQ(ReloadRpc(*on_search_port, absl::nullopt, &reloaded).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  auto admin = AdminStub(s);
  grpc::Status status = ReloadRpc(*admin, absl::nullopt, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 1);
  EXPECT_FALSE(reloaded.loaded());
  auto search_on_admin_port = knnd::v1::KnnService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", s.server->admin_port()),
                          grpc::InsecureChannelCredentials()));
  knnd::v1::SearchResponse response;
  grpc::ClientContext context;
  EXPECT_EQ(search_on_admin_port->Search(&context, Request(1), &response)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  knnd::v1::ServerConfig off = TestConfig(dir);
  off.set_admin_listen_address("");
  RunningServer without = StartServer(off);
  ASSERT_NE(without.stub, nullptr);
  EXPECT_EQ(without.server->admin_port(), 0);

  knnd::v1::ServerConfig shared = TestConfig(dir);
  shared.set_listen_address(absl::StrCat("127.0.0.1:", knnd::testing::FreePort()));
  shared.set_admin_listen_address(shared.listen_address());
  RunningServer one_port = StartServer(shared);
  ASSERT_NE(one_port.stub, nullptr);
  EXPECT_EQ(one_port.server->admin_port(), one_port.server->port());
  auto shared_admin = knnd::v1::AdminService::NewStub(one_port.channel);
  status = ReloadRpc(*shared_admin, absl::nullopt, &reloaded);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A refused version: the RPC returns why, ListVersions marks it, the old
// version serves; pinning and unpinning through the RPC.
TEST(AdminService, ReportsRefusalsPinsAndListsVersions) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  auto admin = AdminStub(s);

  IndexSpec wrong_dim = VersionSpec(2);
  wrong_dim.d = 8;
  ASSERT_EQ(PublishIndex(tmp, dir, wrong_dim), 2);
  knnd::v1::ReloadIndexResponse reloaded;
  grpc::Status status = ReloadRpc(*admin, absl::nullopt, &reloaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("index version 2"));
  EXPECT_THAT(status.error_message(), HasSubstr("dim=8 differs from dim=16"));
  EXPECT_THAT(status.error_message(), HasSubstr("still serving version 1"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Reloads(s, "failed"), 1);

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(3)), 3);
  status = ReloadRpc(*admin, absl::nullopt, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 3);
  EXPECT_EQ(reloaded.pinned_version(), 0);

  knnd::v1::ListVersionsResponse listed;
  {
    grpc::ClientContext context;
    status = admin->ListVersions(&context, {}, &listed);
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(listed.versions_size(), 3);
  EXPECT_EQ(listed.serving_version(), 3);
  EXPECT_TRUE(listed.versions(1).refused());
  EXPECT_THAT(listed.versions(1).refused_reason(), HasSubstr("dim=8"));
  EXPECT_TRUE(listed.versions(2).serving());
  EXPECT_FALSE(listed.versions(0).serving());

  status = ReloadRpc(*admin, 1, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 1);
  EXPECT_EQ(reloaded.previous_version(), 3);
  EXPECT_EQ(reloaded.pinned_version(), 1);
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(ReloadRpc(*admin, 7, &reloaded).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ReloadRpc(*admin, -1, &reloaded).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  status = ReloadRpc(*admin, 0, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 3);
  EXPECT_EQ(reloaded.pinned_version(), 0);
}

// kMaxAdminCalls calls waiting or running (a reload held in the index
// manager's prepare step, the rest behind it): the next call of either
// method is refused RESOURCE_EXHAUSTED naming the limit, without waiting;
// once the reload is let go every held call is answered OK and the
// service takes calls again.
TEST(AdminService, CallsBeyondTheLimitAreRefusedAndTheHeldOnesAnswered) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);

  std::unique_ptr<Metrics> metrics = IdleMetrics();
  ASSERT_NE(metrics, nullptr);
  IndexHolder holder;
  absl::Notification held, release;
  IndexManager::Options options;
  options.index_path = dir;
  options.prepare = [&](const IndexSnapshot& snapshot) {
    if (snapshot.info().version == 2) {
      held.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<IndexManager>> manager =
      IndexManager::Create(options, &holder, metrics.get());
  ASSERT_TRUE(manager.ok()) << manager.status();
  ASSERT_TRUE((*manager)->Reload().ok());
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create({});
  ASSERT_TRUE(auth.ok()) << auth.status();

  AdminServiceImpl service(manager->get(), auth->get());
  absl::StatusOr<Listener> listener =
      knnd::testing::ServeOnLoopback(&service);
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto admin = knnd::v1::AdminService::NewStub(knnd::testing::FreshChannel(
      absl::StrCat("127.0.0.1:", listener->port)));

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  constexpr int kLimit = AdminServiceImpl::kMaxAdminCalls;
  std::vector<grpc::Status> statuses(kLimit);
  std::vector<std::thread> callers;
  callers.emplace_back([&] {
    knnd::v1::ReloadIndexResponse reloaded;
    statuses[0] = ReloadRpc(*admin, absl::nullopt, &reloaded);
  });
  held.WaitForNotification();
  for (int i = 1; i < kLimit; ++i) {
    callers.emplace_back([&, i] {
      knnd::v1::ReloadIndexResponse reloaded;
      statuses[i] = ReloadRpc(*admin, absl::nullopt, &reloaded);
    });
  }
  // The callers' calls reach the service in their own time.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (service.calls_in_progress() < kLimit && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(service.calls_in_progress(), kLimit);

  // Refused at once: with no limit these would wait behind the held
  // reload and end DEADLINE_EXCEEDED.
  auto soon = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(10);
  };
  knnd::v1::ReloadIndexResponse reloaded;
  grpc::Status refused;
  {
    grpc::ClientContext context;
    context.set_deadline(soon());
    refused = admin->ReloadIndex(&context, {}, &reloaded);
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr(absl::StrCat("at most ", kLimit)));
  knnd::v1::ListVersionsResponse listed;
  {
    grpc::ClientContext context;
    context.set_deadline(soon());
    refused = admin->ListVersions(&context, {}, &listed);
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(service.calls_in_progress(), kLimit);

  release.Notify();
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kLimit; ++i) {
    EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].error_message();
  }
  EXPECT_EQ(service.calls_in_progress(), 0);
  EXPECT_EQ(holder.Pin()->info().version, 2);
  grpc::ClientContext context;
  grpc::Status status = admin->ListVersions(&context, {}, &listed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(listed.serving_version(), 2);
  listener->Close(absl::InfinitePast());
}

}  // namespace
}  // namespace knnd
