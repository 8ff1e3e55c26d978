// ToGrpcStatus: codes kept, messages bounded so that a client with gRPC's
// default metadata limit still receives the status.
#include "knnd/rpc/status_util.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Bytes `message` takes percent-encoded in the grpc-message trailer.
size_t WireBytes(const std::string& message) {
  size_t bytes = 0;
  for (unsigned char c : message) {
    bytes += c >= 0x20 && c <= 0x7e && c != '%' ? 1 : 3;
  }
  return bytes;
}

// The shard front's message when every one of 256 shards failed.
std::string ManyShardsFailed() {
  std::string message = "256 of 256 shards failed: ";
  for (int i = 0; i < 256; ++i) {
    absl::StrAppend(&message, i > 0 ? "; " : "", "shard ", i, " (10.0.0.", i,
                    ":50051): deadline passed after 1.2s in the queue, ",
                    "before the search ran");
  }
  return message;
}

TEST(ToGrpcStatus, KeepsCodeAndShortMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status status =
      ToGrpcStatus(absl::InvalidArgumentError("k=5000 exceeds max_k=1024"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "k=5000 exceeds max_k=1024");
}

TEST(BoundStatusMessage, KeepsAMessageThatFitsWhole) {
  const std::string fits(kMaxStatusMessageWireBytes, 'a');
  EXPECT_EQ(BoundStatusMessage(fits), fits);
}

TEST(BoundStatusMessage, KeepsTheHeadAndSaysHowMuchWasCut) {
  const std::string message = ManyShardsFailed();
  ASSERT_GT(message.size(), 4 * kMaxStatusMessageWireBytes);
  const std::string bounded = BoundStatusMessage(message);
  EXPECT_LE(WireBytes(bounded), kMaxStatusMessageWireBytes);
  EXPECT_GT(WireBytes(bounded), kMaxStatusMessageWireBytes - 8);
  EXPECT_THAT(bounded, StartsWith("256 of 256 shards failed: shard 0 "));
  const size_t head = bounded.find(" [... ");
  ASSERT_NE(head, std::string::npos);
  EXPECT_EQ(message.substr(0, head), bounded.substr(0, head));
  EXPECT_THAT(bounded, EndsWith(absl::StrCat(" [... ", message.size() - head,
                                             " more bytes cut]")));
}

// Bytes outside printable ASCII take three on the wire; a character is
// never cut in two.
TEST(BoundStatusMessage, CountsEncodedBytesAndCutsWholeCharacters) {
  std::string message;
  for (int i = 0; i < 2000; ++i) message += "\xc3\xa9";  // 6 bytes encoded
  ASSERT_LT(message.size(), kMaxStatusMessageWireBytes);
  const std::string bounded = BoundStatusMessage(message);
  EXPECT_LE(WireBytes(bounded), kMaxStatusMessageWireBytes);
  const size_t head = bounded.find(" [... ");
  ASSERT_NE(head, std::string::npos);
  EXPECT_EQ(head % 2, 0u) << "a two-byte character was cut";
  EXPECT_GT(head, 1000u);
}

// A KnnService whose Search answers `status`.
class FailingService final : public knnd::v1::KnnService::Service {
 public:
  explicit FailingService(grpc::Status status) : status_(std::move(status)) {}
  grpc::Status Search(grpc::ServerContext*, const knnd::v1::SearchRequest*,
                      knnd::v1::SearchResponse*) override {
    return status_;
  }

 private:
  const grpc::Status status_;
};

// What a client with gRPC's default channel arguments receives when a
// server answers `status`.
grpc::Status Received(const grpc::Status& status) {
  FailingService service(status);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      grpc::ServerBuilder()
          .AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                            &port)
          .RegisterService(&service)
          .BuildAndStart();
  EXPECT_GT(port, 0);
  auto stub = knnd::v1::KnnService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  knnd::v1::SearchResponse response;
  grpc::Status received =
      stub->Search(&context, knnd::v1::SearchRequest(), &response);
  server->Shutdown();
  return received;
}

// The whole message would cost the client the status; the bounded one
// arrives with its code and its head.
TEST(ToGrpcStatus, ALongMessageReachesTheClientWithItsCode) {
  const absl::Status status = absl::UnavailableError(ManyShardsFailed());
  const grpc::Status whole(grpc::StatusCode::UNAVAILABLE,
                           std::string(status.message()));
  EXPECT_NE(Received(whole).error_code(), grpc::StatusCode::UNAVAILABLE);

  const grpc::Status received = Received(ToGrpcStatus(status));
  EXPECT_EQ(received.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(received.error_message(),
              StartsWith("256 of 256 shards failed: shard 0 (10.0.0.0:50051)"));
  EXPECT_THAT(received.error_message(), HasSubstr("more bytes cut]"));
}

}  // namespace
}  // namespace knnd
