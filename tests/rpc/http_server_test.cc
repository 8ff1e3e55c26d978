// HttpServer over a raw client (testing/raw_http.h): keep-alive, answers
// from other threads while the listener thread serves other connections,
// and each bound: a body over the limit (413 before it is sent, chunked
// too), the memory quota (429 with Retry-After, the body dropped; answers
// waiting to be sent count), the read and idle
// timeouts, the connection cap, "Connection: close" while closing, and the
// answers Close() gives to requests still waiting.
#include "knnd/rpc/http_server.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/raw_http.h"

namespace knnd {
namespace {

using ::knnd::testing::RawHttp;
using ::testing::HasSubstr;

HttpServer::Options SmallServer() {
  HttpServer::Options options;
  options.address = "127.0.0.1:0";
  options.threads = 1;
  options.max_body_bytes = 4096;
  options.memory_quota_bytes = 8192;
  return options;
}

// Answers "METHOD PATH BODY-BYTES" at once, the body dropped first (as
// the API does once it has parsed it).
void Echo(std::shared_ptr<HttpExchange> exchange) {
  HttpResponse response;
  response.content_type = "text/plain";
  response.body = absl::StrCat(exchange->method(), " ", exchange->path(), " ",
                               exchange->body().size());
  exchange->DropBody();
  exchange->Respond(std::move(response));
}

std::unique_ptr<HttpServer> Start(const HttpServer::Options& options,
                                  HttpHandler handler = Echo) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(HttpServer, KeepsTheConnectionAliveAcrossRequests) {
  std::unique_ptr<HttpServer> server = Start(SmallServer());
  ASSERT_NE(server, nullptr);
  RawHttp client(server->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client.Send(RawHttp::Request("POST", "/x", "abc")));
    absl::optional<RawHttp::Response> r = client.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /x 3");
    EXPECT_EQ(r->headers.count("connection"), 0u);
  }
}

TEST(HttpServer, AWaitingRequestHoldsNoThread) {
  // One listener thread: while the first request waits for an answer that
  // another thread gives later, the second connection is served.
  absl::Mutex mu;
  std::vector<std::shared_ptr<HttpExchange>> waiting;
  std::unique_ptr<HttpServer> server =
      Start(SmallServer(), [&](std::shared_ptr<HttpExchange> exchange) {
        if (exchange->path() != "/wait") return Echo(std::move(exchange));
        absl::MutexLock lock(&mu);
        waiting.push_back(std::move(exchange));
      });
  ASSERT_NE(server, nullptr);
  RawHttp first(server->port());
  ASSERT_TRUE(first.Send(RawHttp::Request("POST", "/wait", "q")));
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::vector<std::shared_ptr<HttpExchange>>* w) {
          return !w->empty();
        },
        &waiting));
  }
  EXPECT_EQ(server->pending(), 1);
  RawHttp second(server->port());
  ASSERT_TRUE(second.Send(RawHttp::Request("GET", "/now")));
  absl::optional<RawHttp::Response> now = second.Read();
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->body, "GET /now 0");
  std::thread answer([&] {
    absl::MutexLock lock(&mu);
    HttpResponse response;
    response.status = 202;
    response.body = "later";
    waiting.front()->Respond(std::move(response));
    waiting.front()->Respond(HttpResponse());  // a second answer is dropped
  });
  absl::optional<RawHttp::Response> later = first.Read();
  answer.join();
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->status, 202);
  EXPECT_EQ(later->body, "later");
  EXPECT_EQ(server->pending(), 0);
}

TEST(HttpServer, ABodyOverTheLimitIsRefusedBeforeItIsSent) {
  bool called = false;
  std::unique_ptr<HttpServer> server =
      Start(SmallServer(), [&](std::shared_ptr<HttpExchange> exchange) {
        called = true;
        Echo(std::move(exchange));
      });
  ASSERT_NE(server, nullptr);
  RawHttp client(server->port());
  // Headers of a 100 MB body, and none of the body.
  ASSERT_TRUE(client.Send(
      "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000\r\n\r\n"));
  absl::optional<RawHttp::Response> r = client.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("100000000 bytes exceeds "
                                 "http_max_body_bytes=4096"));
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_TRUE(client.ClosedWithin(absl::Seconds(30)));
  EXPECT_FALSE(called);
}

TEST(HttpServer, AChunkedBodyOverTheLimitIsRefusedOnceItPassesIt) {
  std::unique_ptr<HttpServer> server = Start(SmallServer());
  ASSERT_NE(server, nullptr);
  RawHttp client(server->port());
  std::string chunked =
      "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) {
    absl::StrAppend(&chunked, "800\r\n", std::string(2048, 'a'), "\r\n");
  }
  absl::StrAppend(&chunked, "0\r\n\r\n");
  ASSERT_TRUE(client.Send(chunked));
  absl::optional<RawHttp::Response> r = client.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("http_max_body_bytes=4096"));
  // Within the limit, chunked bodies are read whole.
  RawHttp small(server->port());
  ASSERT_TRUE(small.Send(
      "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  r = small.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "POST /x 5");
}

TEST(HttpServer, BodiesPastTheQuotaAreRefusedWithRetryAfter) {
  HttpServer::Options options = SmallServer();
  options.max_body_bytes = 6000;
  std::unique_ptr<HttpServer> server = Start(options);
  ASSERT_NE(server, nullptr);
  // 6000 of the 8192 bytes held by a body half sent.
  RawHttp slow(server->port());
  ASSERT_TRUE(
      slow.Send("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 6000"
                "\r\n\r\n" +
                std::string(100, 'a')));
  absl::optional<RawHttp::Response> r;
  // The first body's headers may still be on their way to the listener.
  for (int attempt = 0; attempt < 100; ++attempt) {
    RawHttp probe(server->port());
    ASSERT_TRUE(
        probe.Send(RawHttp::Request("POST", "/y", std::string(4000, 'b'))));
    r = probe.Read();
    ASSERT_TRUE(r.has_value());
    if (r->status == 429) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->headers["retry-after"], "1");
  EXPECT_THAT(r->body, HasSubstr("http_memory_quota_bytes=8192"));
  // Refused once its body, dropped, was read: the connection goes on.
  EXPECT_EQ(r->headers.count("connection"), 0u);
  ASSERT_TRUE(slow.Send(std::string(5900, 'a')));
  r = slow.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "POST /x 6000");
  RawHttp after(server->port());
  ASSERT_TRUE(
      after.Send(RawHttp::Request("POST", "/y", std::string(4000, 'b'))));
  r = after.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, AnAnswerWaitingToBeSentCountsAgainstTheQuota) {
  HttpServer::Options options = SmallServer();
  options.memory_quota_bytes = int64_t{40} << 20;
  options.max_body_bytes = int64_t{16} << 20;
  constexpr size_t kAnswer = size_t{32} << 20;  // more than sockets buffer
  std::unique_ptr<HttpServer> server =
      Start(options, [](std::shared_ptr<HttpExchange> exchange) {
        if (exchange->path() != "/big") return Echo(std::move(exchange));
        HttpResponse response;
        response.body.assign(kAnswer, 'x');
        exchange->Respond(std::move(response));
      });
  ASSERT_NE(server, nullptr);
  RawHttp reader(server->port());
  ASSERT_TRUE(reader.Send(RawHttp::Request("GET", "/big")));  // not read yet
  const std::string body(16 << 20, 'b');
  absl::optional<RawHttp::Response> r;
  for (int attempt = 0; attempt < 100; ++attempt) {
    RawHttp writer(server->port());
    ASSERT_TRUE(writer.Send(RawHttp::Request("POST", "/y", body)));
    r = writer.Read();
    if (r.has_value() && r->status == 429) break;
  }
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 429);
  absl::optional<RawHttp::Response> big = reader.Read();
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->body.size(), kAnswer);
  // Sent: its bytes are given back.
  for (int attempt = 0; attempt < 100; ++attempt) {
    RawHttp writer(server->port());
    writer.Send(RawHttp::Request("POST", "/y", body));
    r = writer.Read();
    if (r.has_value() && r->status == 200) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "POST /y 16777216");
}

TEST(HttpServer, ARequestSentAByteAtATimeIsCutAtTheReadTimeout) {
  HttpServer::Options options = SmallServer();
  options.read_timeout = absl::Seconds(1);
  std::atomic<bool> called{false};
  std::unique_ptr<HttpServer> server =
      Start(options, [&](std::shared_ptr<HttpExchange> exchange) {
        if (exchange->path() == "/x") called = true;
        Echo(std::move(exchange));
      });
  ASSERT_NE(server, nullptr);
  RawHttp slow(server->port());
  ASSERT_TRUE(slow.Send("POST /x HTTP/1.1\r\n"));
  std::atomic<bool> done{false};
  std::thread dribble([&] {
    for (int i = 0; i < 100 && !done; ++i) {
      if (!slow.Send("X")) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  // Served meanwhile on the same listener thread.
  RawHttp other(server->port());
  ASSERT_TRUE(other.Send(RawHttp::Request("GET", "/ok")));
  absl::optional<RawHttp::Response> r = other.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(30)));
  done = true;
  dribble.join();
  EXPECT_FALSE(called);
}

TEST(HttpServer, AnIdleKeptAliveConnectionIsClosed) {
  HttpServer::Options options = SmallServer();
  options.idle_timeout = absl::Seconds(1);
  std::unique_ptr<HttpServer> server = Start(options);
  ASSERT_NE(server, nullptr);
  RawHttp client(server->port());
  ASSERT_TRUE(client.Send(RawHttp::Request("GET", "/x")));
  ASSERT_TRUE(client.Read().has_value());
  EXPECT_TRUE(client.ClosedWithin(absl::Seconds(30)));
}

TEST(HttpServer, ConnectionsPastTheCapWaitForOneToClose) {
  HttpServer::Options options = SmallServer();
  options.max_connections = 1;
  std::unique_ptr<HttpServer> server = Start(options);
  ASSERT_NE(server, nullptr);
  auto first = std::make_unique<RawHttp>(server->port());
  ASSERT_TRUE(first->Send(RawHttp::Request("GET", "/first")));
  ASSERT_TRUE(first->Read().has_value());
  // The second connection waits in the backlog, its request unread.
  RawHttp second(server->port());
  ASSERT_TRUE(second.Send(RawHttp::Request("GET", "/second")));
  EXPECT_FALSE(second.Read(absl::Milliseconds(500)).has_value());
  first.reset();
  absl::optional<RawHttp::Response> r = second.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /second 0");
}

TEST(HttpServer, WhileClosingEveryAnswerClosesItsConnection) {
  std::unique_ptr<HttpServer> server = Start(SmallServer());
  ASSERT_NE(server, nullptr);
  server->SetClosing();
  RawHttp client(server->port());
  ASSERT_TRUE(client.Send(RawHttp::Request("GET", "/x")));
  absl::optional<RawHttp::Response> r = client.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_TRUE(client.ClosedWithin(absl::Seconds(30)));
}

TEST(HttpServer, CloseAnswersTheRequestsStillWaiting) {
  std::vector<std::shared_ptr<HttpExchange>> kept;
  absl::Notification arrived;
  HttpServer::Options options = SmallServer();
  options.refusal = [](int http_status, const absl::Status& status) {
    HttpResponse response;
    response.status = http_status;
    response.body = absl::StrCat("refused: ", status.message());
    return response;
  };
  std::unique_ptr<HttpServer> server =
      Start(options, [&](std::shared_ptr<HttpExchange> exchange) {
        kept.push_back(std::move(exchange));  // never answered
        arrived.Notify();
      });
  ASSERT_NE(server, nullptr);
  RawHttp client(server->port());
  ASSERT_TRUE(client.Send(RawHttp::Request("POST", "/x", "q")));
  arrived.WaitForNotification();
  std::thread closing(
      [&] { server->Close(absl::Now() + absl::Milliseconds(200)); });
  absl::optional<RawHttp::Response> r = client.Read();
  closing.join();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "refused: knnd is shutting down");
  kept.front()->Respond(HttpResponse());  // too late: dropped
}

TEST(HttpServer, OptionsOutOfRangeAreRefusedNamingTheField) {
  HttpServer::Options options = SmallServer();
  options.max_body_bytes = 100000;  // above the quota
  EXPECT_THAT(HttpServer::ValidateOptions(options).message(),
              HasSubstr("http_max_body_bytes=100000 is outside [1024, 8192]"));
  options = SmallServer();
  options.read_timeout = absl::Milliseconds(10);
  EXPECT_THAT(HttpServer::ValidateOptions(options).message(),
              HasSubstr("http_read_timeout_ms=10"));
  options = SmallServer();
  options.address = "127.0.0.1:notaport";
  EXPECT_FALSE(HttpServer::Start(options, Echo).ok());
}

}  // namespace
}  // namespace knnd
