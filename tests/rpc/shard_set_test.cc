// CheckShardSet: the front's verdict on what its targets answered to
// GetIndexInfo, including values no honest shard sends.
#include "knnd/rpc/shard_set.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;
using knnd::v1::GetIndexInfoResponse;

GetIndexInfoResponse Info(uint32_t id, uint32_t count, int64_t version = 1,
                          const std::string& build = "b1") {
  GetIndexInfoResponse info;
  info.set_dim(8);
  info.set_version(version);
  info.mutable_shard()->set_shard_id(id);
  info.mutable_shard()->set_shard_count(count);
  info.mutable_shard()->set_build_id(build);
  return info;
}

// Targets t0, t1, ... answering `infos`, every poll OK.
absl::Status Check(const std::vector<GetIndexInfoResponse>& infos,
                   const absl::Status& poll = absl::OkStatus()) {
  std::vector<PolledShard> shards;
  for (size_t i = 0; i < infos.size(); ++i) {
    shards.push_back({"t" + std::to_string(i), &poll, &infos[i]});
  }
  return CheckShardSet(shards);
}

TEST(CheckShardSet, ASetInAnyOrderIsReady) {
  EXPECT_TRUE(Check({Info(2, 3), Info(0, 3), Info(1, 3)}).ok());
}

TEST(CheckShardSet, AShardIdOutsideTheSetIsRefusedNamingTheTarget) {
  for (uint32_t id : {3u, 7u, 4294967295u}) {
    absl::Status status = Check({Info(0, 3), Info(id, 3), Info(2, 3)});
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << id;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("target t1 reports shard_id ", id,
                                       " of a set of 3, outside [0, 3)")));
  }
}

TEST(CheckShardSet, TwoTargetsServingOneShardAreRefused) {
  absl::Status status = Check({Info(0, 2), Info(0, 2)});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("targets t0 and t1 both serve shard 0"));
}

TEST(CheckShardSet, AWholeIndexOrAnotherSetSizeIsRefused) {
  EXPECT_THAT(Check({Info(0, 0), Info(1, 2)}).message(),
              HasSubstr("target t0 serves a whole index, not a shard"));
  EXPECT_THAT(Check({Info(0, 2), Info(1, 3)}).message(),
              HasSubstr("target t1 is shard 1 of 3, not of 2"));
}

TEST(CheckShardSet, AFailedPollIsNamed) {
  absl::Status status =
      Check({Info(0, 1)}, absl::UnavailableError("connection refused"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("target t0: connection refused"));
}

TEST(CheckShardSet, ShardsOfDifferentDimsAreNotOneIndex) {
  GetIndexInfoResponse other = Info(1, 2);
  other.set_dim(16);
  EXPECT_THAT(Check({Info(0, 2), other}).message(),
              HasSubstr("are not shards of one index"));
}

TEST(CheckShardSet, EveryShardMustStillHoldTheSetsVersion) {
  // Mid-rollout: shard 1 serves 2 and keeps 1; ready at version 1.
  GetIndexInfoResponse ahead = Info(1, 2, 2, "b2");
  ahead.add_retained_versions(1);
  EXPECT_TRUE(Check({Info(0, 2), ahead}).ok());
  // Without version 1 kept, not ready.
  EXPECT_THAT(Check({Info(0, 2), Info(1, 2, 2, "b2")}).message(),
              HasSubstr("target t1 serves version 2 and no longer has version 1"));
  // One version of two builds.
  EXPECT_THAT(Check({Info(0, 2, 1, "b1"), Info(1, 2, 1, "b2")}).message(),
              HasSubstr("serve version 1 of different builds (b1, b2)"));
}

}  // namespace
}  // namespace knnd
