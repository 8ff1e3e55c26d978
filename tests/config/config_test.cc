// ValidateConfig: settings that cannot work together are refused with the
// field and its limit named.
#include "knnd/config/config.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace knnd
