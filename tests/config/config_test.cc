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

}  // namespace
}  // namespace knnd
