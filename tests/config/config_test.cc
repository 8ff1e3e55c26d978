// ValidateConfig: settings that cannot work together are refused with the
// field and its limit named.
#include "knnd/config/config.h"

#include <gtest/gtest.h>

#include "knnd/config/server_options.h"

#include "testing/test_util.h"

namespace knnd {
namespace {

// inline_max_rows above max_batch_rows would run a multi-unit request inline:
// the config check refuses it, naming the field and its limit.
TEST(BatcherConfig, InlineMaxRowsAboveMaxBatchRowsIsRefused) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("b.index");
  config.set_max_batch_rows(16);
  config.set_inline_max_rows(16);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_inline_max_rows(17);
  ::knnd::testing::ExpectConfigRefused(
      config, "inline_max_rows=17 is outside [0, 16]");
}

// The search port's polling before sleep: 100 us by default, 0 (off) and
// up to 10 ms accepted, more refused with the field and its range.
TEST(TransportConfig, GrpcPollUsIsBounded) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("p.index");
  EXPECT_EQ(config.grpc_poll_us(), 100u);
  config.set_grpc_poll_us(0);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_grpc_poll_us(10000);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_grpc_poll_us(10001);
  ::knnd::testing::ExpectConfigRefused(
      config, "grpc_poll_us=10001 is outside [0, 10000]");
}

// The allocator's top pad: 2 MiB by default, 0 (glibc's) up to glibc's
// 32 MiB accepted, more refused with the field and its range.
TEST(MallocConfig, TopPadIsBounded) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("m.index");
  EXPECT_EQ(config.malloc_top_pad_bytes(), 2u << 20);
  config.set_malloc_top_pad_bytes(0);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_malloc_top_pad_bytes(32u << 20);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_malloc_top_pad_bytes((32u << 20) + 1);
  ::knnd::testing::ExpectConfigRefused(
      config, "malloc_top_pad_bytes=33554433 is outside [0, 33554432]");
}

// Filters nested deeper than 256 are never read (search_request_codec.h),
// so max_filter_depth is 1 to 256: before, any value was taken, and 0 or
// one above 2^31 wrapped into a negative limit.
TEST(FilterConfig, MaxFilterDepthIsBounded) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("f.index");
  EXPECT_EQ(config.max_filter_depth(), 16u);
  config.set_max_filter_depth(256);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_max_filter_depth(257);
  ::knnd::testing::ExpectConfigRefused(
      config, "max_filter_depth=257 is outside [1, 256]");
  config.set_max_filter_depth(0);
  ::knnd::testing::ExpectConfigRefused(
      config, "max_filter_depth=0 is outside [1, 256]");
}

// The shutdown's times: the delay and the grace are bounded, each refusal
// naming the field and its range.
TEST(ShutdownConfig, DelayAndGraceAreBounded) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("s.index");
  EXPECT_EQ(config.shutdown_delay_ms(), 5000u);
  EXPECT_FALSE(config.shutdown_delay_refuses_searches());
  config.set_shutdown_delay_ms(300000);
  config.set_drain_grace_period_ms(3600000);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_shutdown_delay_ms(300001);
  ::knnd::testing::ExpectConfigRefused(
      config, "shutdown_delay_ms=300001 is outside [0, 300000]");
  config.set_shutdown_delay_ms(0);
  config.set_drain_grace_period_ms(3600001);
  ::knnd::testing::ExpectConfigRefused(
      config, "drain_grace_period_ms=3600001 is outside [0, 3600000]");
}

// The gRPC memory quota is half the headroom unless set; the largest
// message accepted is max_receive_message_bytes lowered to half the quota
// and to the byte budget plus 64 KiB; a quota below 1 MiB is refused.
TEST(GrpcMemoryConfig, QuotaAndLargestMessageFollowHeadroomAndBudget) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("g.index");
  EXPECT_EQ(config.grpc_memory_quota_bytes(), 0u);
  config.set_memory_headroom_bytes(128 * kMiB);
  ConnectionLimits limits = ConnectionLimitsFrom(config, 0);
  EXPECT_EQ(limits.memory_quota_bytes, 64 * kMiB);
  EXPECT_EQ(limits.max_receive_message_bytes, 32 * kMiB);  // half the quota
  limits = ConnectionLimitsFrom(config, 8 * kMiB);
  EXPECT_EQ(limits.max_receive_message_bytes, 8 * kMiB + 64 * 1024);
  config.set_grpc_memory_quota_bytes(512 * kMiB);
  limits = ConnectionLimitsFrom(config, 0);
  EXPECT_EQ(limits.memory_quota_bytes, 512 * kMiB);
  EXPECT_EQ(limits.max_receive_message_bytes, 64 * kMiB);  // as configured
  EXPECT_TRUE(ValidateConfig(config).ok());
  // The health and admin ports: at most 4 MiB, the rest as the search port.
  EXPECT_EQ(SmallPortLimits(limits).memory_quota_bytes, 4 * kMiB);
  EXPECT_EQ(SmallPortLimits(limits).max_receive_message_bytes,
            limits.max_receive_message_bytes);
  config.set_grpc_memory_quota_bytes(0);
  config.set_memory_headroom_bytes(0);  // no headroom: no quota either
  limits = ConnectionLimitsFrom(config, 0);
  EXPECT_EQ(limits.memory_quota_bytes, 0);
  EXPECT_EQ(limits.max_receive_message_bytes, 64 * kMiB);
  EXPECT_EQ(SmallPortLimits(limits).memory_quota_bytes, 4 * kMiB);
  config.set_grpc_memory_quota_bytes(1000);
  ::knnd::testing::ExpectConfigRefused(config, "grpc_memory_quota_bytes is 1000");
}

// The HTTP listener: off by default; its body limit is the largest gRPC
// message within half its quota (a quarter of the headroom); its fields are
// checked only when it is on, each naming its range.
TEST(HttpConfig, BodyLimitFollowsTheLargestMessageAndTheQuota) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("h.index");
  EXPECT_EQ(config.http_listen_address(), "");
  HttpServer::Options http =
      HttpServerOptionsFrom(config, ConnectionLimitsFrom(config, 0));
  EXPECT_EQ(http.memory_quota_bytes, 32 * kMiB);
  EXPECT_EQ(http.max_body_bytes, 16 * kMiB);
  http = HttpServerOptionsFrom(config, ConnectionLimitsFrom(config, 4 * kMiB));
  EXPECT_EQ(http.max_body_bytes, 4 * kMiB + 64 * 1024);  // the gRPC message
  config.set_http_max_connections(0);                    // off: not checked
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_http_listen_address("127.0.0.1:0");
  ::knnd::testing::ExpectConfigRefused(
      config, "http_max_connections=0 is outside [1, 1000000]");
  config.set_http_max_connections(10);
  config.set_http_memory_quota_bytes(2 * kMiB);
  config.set_http_max_body_bytes(3 * kMiB);
  ::knnd::testing::ExpectConfigRefused(
      config, "http_max_body_bytes=3145728 is outside [1024, 2097152]");
  config.set_http_max_body_bytes(0);
  EXPECT_EQ(HttpServerOptionsFrom(config, ConnectionLimitsFrom(config, 0))
                .max_body_bytes,
            kMiB);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_http_memory_quota_bytes(1000);
  ::knnd::testing::ExpectConfigRefused(config,
                                       "http_memory_quota_bytes is 1000");
  config.set_http_memory_quota_bytes(0);
  config.set_http_read_timeout_ms(999);
  ::knnd::testing::ExpectConfigRefused(
      config, "http_read_timeout_ms=999 is outside [1000, 3600000]");
}

// max_queue_time_ms: 0 (no bound) by default, at most an hour.
TEST(QueueTimeConfig, BoundIsOffByDefaultAndAtMostAnHour) {
  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("q.index");
  EXPECT_EQ(config.max_queue_time_ms(), 0u);
  config.set_max_queue_time_ms(3600000);
  EXPECT_TRUE(ValidateConfig(config).ok());
  EXPECT_EQ(GateOptionsFrom(config).max_queue_time, absl::Hours(1));
  config.set_max_queue_time_ms(3600001);
  ::knnd::testing::ExpectConfigRefused(
      config, "max_queue_time_ms=3600001 is outside [0, 3600000]");
}

}  // namespace
}  // namespace knnd
