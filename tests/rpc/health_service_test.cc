// HealthService (grpc.health.v1 Check and Watch) on an in-process server,
// and CallHold, which delays the answers of the calls refused around
// GOAWAY.
#include "knnd/rpc/health_service.h"

#include <atomic>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/listener.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

// A HealthService for "" and "knnd.v1.KnnService" on a loopback port.
struct HealthServer {
  explicit HealthServer(CallHold* hold = nullptr)
      : service({"knnd.v1.KnnService"}, hold) {
    absl::StatusOr<Listener> listener =
        knnd::testing::ServeOnLoopback(&service);
    EXPECT_TRUE(listener.ok()) << listener.status();
    stub = Health::NewStub(knnd::testing::FreshChannel(
        "127.0.0.1:" + std::to_string(listener->port)));
    server = std::move(*listener);
  }
  ~HealthServer() {
    service.EndWatches();
    server.Close(absl::InfinitePast());
  }

  grpc::Status Check(const std::string& name, HealthCheckResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(name);
    return stub->Check(&context, request, response);
  }

  HealthService service;
  Listener server;
  std::unique_ptr<Health::Stub> stub;
};

HealthCheckResponse::ServingStatus StatusOf(HealthServer& s,
                                            const std::string& name) {
  HealthCheckResponse response;
  const grpc::Status status = s.Check(name, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

// Every service starts NOT_SERVING (no SERVING before the index is
// served) and follows SetServing(); an unknown name is NOT_FOUND, naming it.
TEST(HealthService, CheckStartsNotServingAndFollowsSetServing) {
  HealthServer s;
  EXPECT_EQ(StatusOf(s, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf(s, "knnd.v1.KnnService"), HealthCheckResponse::NOT_SERVING);
  s.service.SetServing(true);
  EXPECT_EQ(StatusOf(s, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(StatusOf(s, "knnd.v1.KnnService"), HealthCheckResponse::SERVING);
  s.service.SetServing(false);
  EXPECT_EQ(StatusOf(s, "knnd.v1.KnnService"), HealthCheckResponse::NOT_SERVING);
  HealthCheckResponse response;
  const grpc::Status unknown = s.Check("other.Service", &response);
  EXPECT_EQ(unknown.error_code(), grpc::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("\"other.Service\""));
  EXPECT_THAT(unknown.error_message(), HasSubstr("knnd.v1.KnnService"));
}

// Watch sends the current status, then each change; EndWatches() ends the
// stream UNAVAILABLE "knnd is shutting down", and a later Watch at once.
TEST(HealthService, WatchStreamsChangesUntilEndWatches) {
  HealthServer s;
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("knnd.v1.KnnService");
  auto reader = s.stub->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  s.service.SetServing(true);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  s.service.SetServing(true);  // no change, nothing sent
  s.service.SetServing(false);
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  s.service.EndWatches();
  EXPECT_FALSE(reader->Read(&response));
  grpc::Status ended = reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::UNAVAILABLE);
  EXPECT_THAT(ended.error_message(), HasSubstr("knnd is shutting down"));

  grpc::ClientContext late_context;
  auto late = s.stub->Watch(&late_context, request);
  EXPECT_FALSE(late->Read(&response));
  EXPECT_EQ(late->Finish().error_code(), grpc::UNAVAILABLE);
}

// An unknown service is SERVICE_UNKNOWN on Watch, and the stream stays
// open; a watcher that goes away is forgotten (the server shuts down).
TEST(HealthService, WatchOfAnUnknownServiceStaysOpen) {
  HealthServer s;
  auto context = std::make_unique<grpc::ClientContext>();
  HealthCheckRequest request;
  request.set_service("other.Service");
  auto reader = s.stub->Watch(context.get(), request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  s.service.SetServing(true);  // still unknown: nothing new is sent
  context->TryCancel();
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
}

// Many watchers and fast changes: every stream comes to the final status
// (after a write in flight only the latest is sent, never lost), or the
// wait below gives up and the test fails.
TEST(HealthService, EveryWatcherComesToTheLatestStatus) {
  HealthServer s;
  constexpr int kWatchers = 8;
  std::vector<std::thread> watchers;
  std::vector<std::atomic<int>> last(kWatchers);
  std::atomic<int> started{0};
  absl::Notification all_started;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.emplace_back([&, i] {
      grpc::ClientContext context;
      auto reader = s.stub->Watch(&context, HealthCheckRequest());
      HealthCheckResponse response;
      ASSERT_TRUE(reader->Read(&response));
      last[i] = response.status();
      if (++started == kWatchers) all_started.Notify();
      while (reader->Read(&response)) last[i] = response.status();
      reader->Finish();
    });
  }
  all_started.WaitForNotification();
  for (int i = 0; i < 200; ++i) s.service.SetServing(i % 2 == 0);
  s.service.SetServing(true);
  auto all_serving = [&] {
    for (const std::atomic<int>& status : last) {
      if (status != HealthCheckResponse::SERVING) return false;
    }
    return true;
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!all_serving() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(all_serving());
  s.service.EndWatches();
  for (std::thread& t : watchers) t.join();
}

// While the hold is on, Check's answer waits for Release().
TEST(HealthService, CheckIsHeldWhileTheHoldIsOn) {
  CallHold hold;
  HealthServer s(&hold);
  hold.Start();
  std::atomic<bool> answered{false};
  HealthCheckResponse response;
  std::thread check([&] {
    EXPECT_TRUE(s.Check("", &response).ok());
    answered = true;
  });
  while (hold.held() == 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(answered.load());
  hold.Release();
  check.join();
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(StatusOf(s, ""), HealthCheckResponse::NOT_SERVING);  // not held
}

// CallHold: nothing is held before Start() or after Release(); a held call
// is answered on Release(), or `margin` before its deadline; a deadline
// nearer than the margin is not held.
TEST(CallHold, HoldsBetweenStartAndReleaseWithinTheDeadline) {
  CallHold hold(absl::Milliseconds(50));
  int answers = 0;
  auto count = [&answers] { ++answers; };
  const absl::Time far = absl::Now() + absl::Hours(1);
  EXPECT_FALSE(hold.Hold(far, count));
  hold.Start();
  EXPECT_TRUE(hold.holding());
  EXPECT_TRUE(hold.Hold(far, count));
  EXPECT_TRUE(hold.Hold(far, count));
  EXPECT_FALSE(hold.Hold(absl::Now() + absl::Milliseconds(10), count));
  EXPECT_EQ(hold.held(), 2);
  EXPECT_EQ(answers, 0);
  hold.Release();
  EXPECT_EQ(answers, 2);
  EXPECT_FALSE(hold.holding());
  EXPECT_FALSE(hold.Hold(far, count));
}

TEST(CallHold, AnswersBeforeTheDeadlineWithoutRelease) {
  CallHold hold(absl::Milliseconds(50));
  hold.Start();
  absl::Notification answered;
  ASSERT_TRUE(hold.Hold(absl::Now() + absl::Milliseconds(200),
                        [&] { answered.Notify(); }));
  // Answered by the hold's timer, with no Release().
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(hold.held(), 0);
  EXPECT_TRUE(hold.holding());
}

}  // namespace
}  // namespace knnd
