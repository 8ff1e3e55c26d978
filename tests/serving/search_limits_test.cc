// ResolveLimits: the one source of request defaults and limits for Search,
// GetIndexInfo, warm-up and the canary.
#include "knnd/serving/search_limits.h"

#include <gtest/gtest.h>

namespace knnd {
namespace {

IndexInfo Index(int64_t nlist, int stored_nprobe, bool has_vectors) {
  IndexInfo info;
  info.nlist = nlist;
  info.stored_nprobe = stored_nprobe;
  info.has_vectors = has_vectors;
  return info;
}

IndexInfo Tuned(int nprobe, int refine_factor) {
  IndexInfo info = Index(256, 4, /*has_vectors=*/true);
  info.tuned_nprobe = nprobe;
  info.tuned_refine_factor = refine_factor;
  return info;
}

TEST(ResolveLimits, UnsetDefaultsComeFromTheFileWithoutTuning) {
  const SearchLimits l = ResolveLimits(LimitsConfig{}, Index(256, 4, true));
  EXPECT_EQ(l.default_nprobe, 4);
  EXPECT_EQ(l.max_nprobe, 256);
  EXPECT_EQ(l.default_refine_factor, 0);
  EXPECT_EQ(l.defaults_source, DefaultsSource::kIndex);
  EXPECT_STREQ(DefaultsSourceName(l.defaults_source), "index");
}

TEST(ResolveLimits, TunedDefaultsWinWhenTheConfigLeavesThemUnset) {
  const SearchLimits l = ResolveLimits(LimitsConfig{}, Tuned(16, 8));
  EXPECT_EQ(l.default_nprobe, 16);
  EXPECT_EQ(l.default_refine_factor, 8);
  EXPECT_EQ(l.defaults_source, DefaultsSource::kTuned);
}

TEST(ResolveLimits, ConfiguredDefaultsOverrideTheTunedOnes) {
  LimitsConfig config;
  config.default_nprobe = 2;
  SearchLimits l = ResolveLimits(config, Tuned(16, 8));
  EXPECT_EQ(l.default_nprobe, 2);
  EXPECT_EQ(l.default_refine_factor, 8);  // still unset in the config
  EXPECT_EQ(l.defaults_source, DefaultsSource::kConfig);

  config = LimitsConfig{};
  config.default_refine_factor = 0;  // explicitly no re-ranking
  l = ResolveLimits(config, Tuned(16, 8));
  EXPECT_EQ(l.default_nprobe, 16);
  EXPECT_EQ(l.default_refine_factor, 0);
  EXPECT_EQ(l.defaults_source, DefaultsSource::kConfig);
}

TEST(ResolveLimits, DefaultsAreClampedToTheirMaxima) {
  LimitsConfig config;
  config.max_nprobe = 8;
  config.max_refine_factor = 4;
  const SearchLimits l = ResolveLimits(config, Tuned(16, 8));
  EXPECT_EQ(l.max_nprobe, 8);
  EXPECT_EQ(l.default_nprobe, 8);
  EXPECT_EQ(l.default_refine_factor, 4);
}

TEST(ResolveLimits, NoReRankingWithoutTheVectorsFile) {
  IndexInfo info = Tuned(16, 8);
  info.has_vectors = false;
  LimitsConfig config;
  config.default_refine_factor = 4;
  EXPECT_EQ(ResolveLimits(LimitsConfig{}, info).default_refine_factor, 0);
  EXPECT_EQ(ResolveLimits(config, info).default_refine_factor, 0);
}

}  // namespace
}  // namespace knnd
