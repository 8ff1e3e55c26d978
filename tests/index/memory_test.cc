// The memory model, the index heap check before loading (start-up and hot
// swap) and the byte budget derived from a memory limit.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/config/config.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/index/memory_model.h"
#include "knnd/server.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

IndexInfo Info(int dim, int64_t nlist, int m) {
  IndexInfo info;
  info.path = "x.index";
  info.dim = dim;
  info.nlist = nlist;
  info.pq_m = m;
  info.pq_nbits = 8;
  return info;
}

TEST(MemoryModel, EstimateCountsEachBufferOfTheModel) {
  const IndexInfo info = Info(128, 4096, 32);
  SearchShape one{1, 10, 16, 0, 0, 256};
  // query + 3 x results + coarse ids/distances + norms + 2 PQ tables + 2 d.
  EXPECT_EQ(EstimateSearchBytes(info, one),
            128 * 4 + 3 * 10 * 12 + 16 * 12 + 4096 * 4 +
                (2 * 32 * 256 * 4 + 2 * 128 * 4));
  // 512 rows: two FAISS calls of 256 rows, each with its tables, and the
  // BLAS block of the coarse search (min(nlist, 1024) columns).
  SearchShape big{512, 10, 16, 0, 0, 256};
  EXPECT_EQ(EstimateSearchBytes(info, big),
            512 * 128 * 4 + 3 * 512 * 10 * 12 + 512 * 16 * 12 +
                512 * 1024 * 4 + 4096 * 4 +
                2 * (2 * 32 * 256 * 4 + 2 * 128 * 4));
  SearchShape filtered = one;
  filtered.filter_ids = 1000;
  EXPECT_EQ(EstimateSearchBytes(info, filtered) - EstimateSearchBytes(info, one),
            1000 * 16);
}

TEST(MemoryModel, PrecomputedTableIsNlistTimesMTimesKsubFloats) {
  EXPECT_EQ(PrecomputedTableBytes(4096, 32, 8), int64_t{4096} * 32 * 256 * 4);
  EXPECT_EQ(PrecomputedTableBytes(1024, 16, 4), int64_t{1024} * 16 * 16 * 4);
}

TEST(MemoryModel, IndexFitsOnlyWithTheVersionServingAndTheHeadroom) {
  IndexInfo planned = Info(64, 1024, 16);
  planned.heap_bytes = 300 << 20;
  planned.precomputed_table_bytes = 256 << 20;
  MemoryLimits limits{512 << 20, 128 << 20};
  EXPECT_TRUE(CheckIndexFits(planned, 0, limits).ok());
  absl::Status swap = CheckIndexFits(planned, 100 << 20, limits);
  EXPECT_EQ(swap.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("100.0 MiB of the version still serving"));
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("more than the memory limit of 512.0 MiB"));
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("use_precomputed_table: false (saves 256.0 MiB)"));
  EXPECT_TRUE(CheckIndexFits(planned, 100 << 20, MemoryLimits{0, 0}).ok());
}

TEST(MemoryModel, BudgetIsAShareOfWhatTheLimitLeavesElseTheFixedValue) {
  MemoryLimits limits{1000 << 20, 100 << 20};
  EXPECT_EQ(InflightBytesBudget(limits, 300 << 20, 50, 7),
            int64_t{600 << 20} / 100 * 50);
  EXPECT_EQ(InflightBytesBudget(MemoryLimits{0, 100 << 20}, 300 << 20, 50, 7),
            7);
  // Nothing left: a budget of 1 byte refuses requests instead of lifting
  // the bound.
  EXPECT_EQ(InflightBytesBudget(limits, 1000 << 20, 50, 7), 1);
}

IndexSpec TableSpec(int64_t nlist, int m) {
  IndexSpec spec;
  spec.n = 6000;
  spec.d = 32;
  spec.factory = absl::StrCat("IVF", nlist, ",PQ", m);
  return spec;
}

TEST(IndexHeapCheck, SeesThePlannedTableBeforeItIsBuiltAndCanRefuse) {
  TempDir tmp;
  WriteIndex(tmp.path("a.index"), TableSpec(64, 8));
  const int64_t table = int64_t{64} * 8 * 256 * 4;
  LoadOptions options;
  options.probe_in_subprocess = false;
  IndexInfo seen;
  options.check_heap = [&](const IndexInfo& planned) {
    seen = planned;
    return absl::OkStatus();
  };
  auto loaded = IndexSnapshot::Load(tmp.path("a.index"), options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(seen.precomputed_table_bytes, table);
  EXPECT_EQ(seen.heap_bytes, (*loaded)->info().heap_bytes);
  EXPECT_EQ((*loaded)->info().precomputed_table_bytes, table);

  options.check_heap = [](const IndexInfo&) {
    return absl::ResourceExhaustedError("too big");
  };
  auto refused = IndexSnapshot::Load(tmp.path("a.index"), options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  options.use_precomputed_table = false;
  options.check_heap = [&](const IndexInfo& planned) {
    seen = planned;
    return absl::OkStatus();
  };
  ASSERT_TRUE(IndexSnapshot::Load(tmp.path("a.index"), options).ok());
  EXPECT_EQ(seen.precomputed_table_bytes, 0);
}

TEST(IndexHeapCheck, StartUpIsRefusedWhenTheHeapNeedExceedsTheLimit) {
  TempDir tmp;
  WriteIndex(tmp.path("a.index"), TableSpec(128, 16));  // table 2 MiB
  knnd::v1::ServerConfig config = TestConfig(tmp.path("a.index"));
  config.set_memory_limit_bytes(1 << 20);
  config.set_memory_headroom_bytes(0);
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto server = Server::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Start().ok());
  absl::Status loaded = (*server)->LoadIndex();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kResourceExhausted) << loaded;
  EXPECT_THAT(std::string(loaded.message()),
              HasSubstr("more than the memory limit of 1.0 MiB"));
  EXPECT_THAT(std::string(loaded.message()),
              HasSubstr("use_precomputed_table: false (saves 2.0 MiB)"));
  EXPECT_EQ((*server)->holder().Pin(), nullptr);

  // Without the table the same index fits, and the byte budget becomes half
  // of what the limit leaves.
  config.set_use_precomputed_table(false);
  config.set_metrics_listen_address(
      absl::StrCat("127.0.0.1:", testing::FreePort()));
  testing::RunningServer lean = StartServer(config);
  ASSERT_NE(lean.server, nullptr);
  auto snapshot = lean.server->holder().Pin();
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(lean.server->gate().max_inflight_bytes(),
            ((1 << 20) - snapshot->info().heap_bytes) / 100 * 50);
}

TEST(IndexHeapCheck, ExplicitMaxInflightBytesWinsOverTheLimitShare) {
  TempDir tmp;
  WriteIndex(tmp.path("a.index"), TableSpec(16, 4));
  knnd::v1::ServerConfig config = TestConfig(tmp.path("a.index"));
  config.set_memory_limit_bytes(64 << 20);
  config.set_memory_headroom_bytes(0);
  config.set_max_inflight_bytes(12345678);
  testing::RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  EXPECT_EQ(s.server->gate().max_inflight_bytes(), 12345678);
}

TEST(IndexHeapCheck, HotSwapToAVersionThatDoesNotFitKeepsTheOldOneServing) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  WriteIndex(tmp.path("v1.index"), TableSpec(16, 4));    // table 64 KiB
  WriteIndex(tmp.path("v2.index"), TableSpec(256, 16));  // table 4 MiB
  ASSERT_TRUE(PublishVersion(dir, tmp.path("v1.index")).ok());
  knnd::v1::ServerConfig config = TestConfig(dir);
  config.set_memory_limit_bytes(2 << 20);
  config.set_memory_headroom_bytes(0);
  testing::RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  const int64_t budget = s.server->gate().max_inflight_bytes();
  ASSERT_TRUE(PublishVersion(dir, tmp.path("v2.index")).ok());
  auto reload = s.server->index_manager().Reload();
  EXPECT_EQ(reload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(reload.status().message()),
              HasSubstr("still serving version 1"));
  EXPECT_THAT(std::string(reload.status().message()),
              HasSubstr("more than the memory limit"));
  EXPECT_EQ(s.server->holder().Pin()->info().version, 1);
  EXPECT_EQ(s.server->gate().max_inflight_bytes(), budget);
}

}  // namespace
}  // namespace knnd
