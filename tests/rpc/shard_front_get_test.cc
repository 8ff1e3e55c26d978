// The front of shards' Get (shard_front_get.cc), in one process: an index
// with own ids, payloads, attributes and raw vectors split in 3 shards, a
// Server per shard, a front Server, and the unsharded index beside them:
// the front's records are the unsharded index's, missing ids the same;
// the shards' limit checked before anything is sent; a shard down fails
// the call naming it.
#include "knnd/rpc/shard_front.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using knnd::testing::BuildIndex;
using knnd::testing::BuildSpec;
using knnd::testing::RunningServer;
using knnd::testing::ServedShardSet;
using knnd::testing::ServeShardSet;
using knnd::testing::TempDir;
using knnd::v1::GetRequest;
using knnd::v1::GetResponse;
using ::testing::HasSubstr;

constexpr int kShards = 3;

grpc::Status CallGet(const RunningServer& server, const GetRequest& request,
                     GetResponse* response) {
  grpc::ClientContext context;
  return server.stub->Get(&context, request, response);
}

TEST(ShardFrontGet, RecordsAreTheUnshardedIndexsAndAShardDownIsNamed) {
  TempDir tmp;
  const std::string index = tmp.path("get.index");
  BuildSpec spec;
  spec.n = 1500;
  spec.d = 8;
  spec.factory = "IVF8,PQ8x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  spec.attributes = knnd::testing::MakeAttributes(spec.n, 4);
  for (int64_t row = 0; row < spec.n; ++row) {
    spec.ids.push_back(11 * row + 5);
    spec.payloads.push_back(absl::StrCat("{\"row\": ", row, "}"));
  }
  BuildIndex(index, spec);
  ServedShardSet set = ServeShardSet(index, kShards);
  const RunningServer& front = set.front;

  // Rows 0, 700 and 1499 lie in each of the 3 shards; 4 and 17 are no
  // row's ids; one id twice.
  GetRequest request;
  for (int64_t id : {11 * 700 + 5, 4, 5, 11 * 1499 + 5, 17, 5}) {
    request.add_ids(id);
  }
  request.mutable_payloads()->set_all_fields(true);
  request.set_with_attributes(true);
  request.set_with_vectors(true);
  GetResponse merged;
  GetResponse unsharded;
  ASSERT_TRUE(CallGet(front, request, &merged).ok());
  ASSERT_TRUE(CallGet(set.whole, request, &unsharded).ok());
  ASSERT_EQ(merged.records_size(), 3);
  EXPECT_EQ(merged.records(0).payload(), "{\"row\":700}");
  EXPECT_EQ(merged.records(2).vector_size(), 8);
  EXPECT_THAT(merged.missing(), ::testing::ElementsAre(4, 17));
  EXPECT_EQ(merged.index_version(), unsharded.index_version());
  // Equal but for the versions (every server serves version 1 here).
  EXPECT_EQ(merged.SerializeAsString(), unsharded.SerializeAsString());

  // The shards' max_get_ids (1024 by default) is the front's.
  GetRequest many;
  for (int64_t id = 0; id < 1025; ++id) many.add_ids(id);
  grpc::Status refused = CallGet(front, many, &merged);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("ids holds 1025 ids, more than max_get_ids=1024"));

  set.shards[1].server.reset();  // shard 1 stops answering
  grpc::Status failed = CallGet(front, request, &merged);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(failed.error_message(), HasSubstr("1 of 3 shards failed"));
  EXPECT_THAT(failed.error_message(), HasSubstr(set.shards[1].address));
}

}  // namespace
}  // namespace knnd
