// Server reflection: on by default (grpcurl and friends can list and call
// the API), off with enable_reflection: false.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteIndex;

struct ReflectionAnswer {
  grpc::Status status;
  std::string bytes;  // the first response message, serialized
};

// Asks grpc.reflection.v1alpha.ServerReflection for the list of services,
// with a hand-encoded request: field 7 (list_services), empty string.
ReflectionAnswer ListServices(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  ReflectionAnswer answer;
  if (ok) {
    std::vector<grpc::Slice> slices;
    (void)in.Dump(&slices);
    for (const grpc::Slice& s : slices) {
      answer.bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  call->Finish(&answer.status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return answer;
}

TEST(Reflection, OnByDefaultListsTheSearchService) {
  TempDir tmp;
  WriteIndex(tmp.path("r.index"), IndexSpec{});
  knnd::v1::ServerConfig config = TestConfig(tmp.path("r.index"));
  config.clear_enable_reflection();  // the default
  auto server = StartServer(config);
  ReflectionAnswer answer = ListServices(server.address);
  EXPECT_TRUE(answer.status.ok()) << answer.status.error_message();
  EXPECT_NE(answer.bytes.find("knnd.v1.KnnService"), std::string::npos);
  EXPECT_NE(answer.bytes.find("grpc.health.v1.Health"), std::string::npos);
}

TEST(Reflection, OffWhenDisabled) {
  TempDir tmp;
  WriteIndex(tmp.path("r.index"), IndexSpec{});
  knnd::v1::ServerConfig config = TestConfig(tmp.path("r.index"));
  config.set_enable_reflection(false);
  auto server = StartServer(config);
  ReflectionAnswer answer = ListServices(server.address);
  EXPECT_EQ(answer.status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(answer.bytes, "");
}

}  // namespace
}  // namespace knnd
