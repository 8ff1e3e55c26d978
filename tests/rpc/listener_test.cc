// RequestReads (rpc/listener.h): how many Search messages knnd reads at
// once, from gRPC's memory quota and the largest message.
#include "knnd/rpc/listener.h"

#include <gtest/gtest.h>

#include "knnd/config/server_options.h"

namespace knnd {
namespace {

TEST(RequestReads, AsManyOfTheLargestMessageAsTheQuotaHolds) {
  ConnectionLimits limits;
  limits.memory_quota_bytes = int64_t{64} << 20;
  limits.max_receive_message_bytes = int64_t{32} << 20;
  EXPECT_EQ(RequestReads(limits), 2);
  limits.max_receive_message_bytes = int64_t{48} << 20;
  EXPECT_EQ(RequestReads(limits), 1);
  // A message larger than the quota is still read, one at a time.
  limits.max_receive_message_bytes = int64_t{128} << 20;
  EXPECT_EQ(RequestReads(limits), 1);
  limits.max_receive_message_bytes = int64_t{1} << 20;
  EXPECT_EQ(RequestReads(limits), kMaxRequestReads);
  limits.memory_quota_bytes = 0;  // no quota
  EXPECT_EQ(RequestReads(limits), kMaxRequestReads);
}

// knnd's defaults: a quota of half the 128 MiB headroom and a largest
// message of half the quota.
TEST(RequestReads, TwoWithTheDefaults) {
  const knnd::v1::ServerConfig config;
  EXPECT_EQ(RequestReads(ConnectionLimitsFrom(config, int64_t{1} << 30)), 2);
}

}  // namespace
}  // namespace knnd
