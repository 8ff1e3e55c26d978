// IndexManager on its own with the production defaults, and through an
// in-process server: hot swaps under load, refusals, pinning and rollback,
// retention, reload triggers, the checksum check before serving or off,
// and memory given back after a swap.
#include "knnd/lifecycle/index_manager.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "knnd/config/config.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/monitoring/process_stats.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "testing/glibc_malloc.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using ::knnd::testing::AdminStub;
using ::knnd::testing::ChecksumState;
using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::IdleMetrics;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::kDim;
using ::knnd::testing::kVersionIdStride;
using ::knnd::testing::kRows;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::Reloads;
using ::knnd::testing::ReloadRpc;
using ::knnd::testing::Request;
using ::knnd::testing::RunningServer;
using ::knnd::testing::ServedVersion;
using ::knnd::testing::ServeVersionOne;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

// Writes a sidecar describing `index` as it is, and the manifest binding
// the two, so that only knnd's own checks can refuse it.
void WriteSidecar(const std::string& index, int dim, const std::string& metric,
                  int64_t ntotal) {
  knnd::v1::IndexMetadata meta;
  meta.set_format_version(kIndexMetadataFormatVersion);
  meta.set_dim(dim);
  meta.set_metric(metric);
  meta.set_ntotal(ntotal);
  meta.set_file_bytes(static_cast<int64_t>(fs::file_size(index)));
  absl::StatusOr<std::string> crc = FileCrc32(index);
  ASSERT_TRUE(crc.ok()) << crc.status();
  meta.set_crc32(*crc);
  ASSERT_TRUE(WriteIndexMetadata(MetadataPath(index), meta).ok());
  ASSERT_TRUE(SealVersion(index, "index_manager_test").ok());
}

bool Mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  const std::string canonical = fs::canonical(path).string();
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() >= canonical.size() &&
        line.compare(line.size() - canonical.size(), canonical.size(),
                     canonical) == 0) {
      return true;
    }
  }
  return false;
}

// IndexManager::Create with the production defaults (only the path set):
// bad options are refused naming them; Reload() serves the highest
// complete version through the holder, verifying its checksums in the
// background (the start-up default), and says what it did; a second
// Reload() finds it served.
TEST(IndexManager, CreatedWithTheDefaultsServesTheNewestVersion) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  std::unique_ptr<Metrics> metrics = IdleMetrics();
  ASSERT_NE(metrics, nullptr);
  IndexHolder holder;

  IndexManager::Options options;
  EXPECT_THAT(
      IndexManager::Create(options, &holder, metrics.get()).status().message(),
      HasSubstr("no index path"));
  options.index_path = dir;
  absl::StatusOr<std::unique_ptr<IndexManager>> manager =
      IndexManager::Create(options, &holder, metrics.get());
  ASSERT_TRUE(manager.ok()) << manager.status();
  EXPECT_EQ(holder.Pin(), nullptr) << "Create loads nothing";

  absl::StatusOr<IndexManager::Outcome> outcome = (*manager)->Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->version, 2);
  EXPECT_TRUE(outcome->loaded);
  EXPECT_EQ(outcome->previous_version, 0);
  EXPECT_EQ(outcome->path, dir + "/2/index.faiss");
  std::shared_ptr<const IndexSnapshot> serving = holder.Pin();
  ASSERT_NE(serving, nullptr);
  EXPECT_EQ(serving->info().version, 2);
  EXPECT_TRUE(
      (*manager)->AwaitBackgroundCheck(absl::Now() + absl::Seconds(60)).ok());

  outcome = (*manager)->Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->version, 2);
  EXPECT_FALSE(outcome->loaded);
  EXPECT_EQ(outcome->previous_version, 2);
}

// Clients search without pause while versions are published and swapped in:
// no request fails, and every answer's ids belong to the version it names.
TEST(IndexManager, SwapsUnderLoadWithoutFailedRequests) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> answered{0};
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::set<int64_t> versions_seen;
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      uint32_t seed = 100 * c;
      while (!stop.load()) {
        knnd::v1::SearchResponse response;
        grpc::ClientContext context;
        grpc::Status status = s.stub->Search(&context, Request(++seed),
                                             &response);
        std::string bad;
        const int64_t v = response.index_version();
        if (!status.ok()) {
          bad = absl::StrCat("status ", status.error_code(), ": ",
                             status.error_message());
        } else {
          for (int64_t id : response.ids()) {
            if (id != -1 && (id < v * kVersionIdStride || id >= v * kVersionIdStride + kRows)) {
              bad = absl::StrCat("id ", id, " in an answer of version ", v);
            }
          }
        }
        absl::MutexLock lock(&mu);
        if (!bad.empty()) failures.push_back(bad);
        versions_seen.insert(v);
        answered.fetch_add(1);
      }
    });
  }

  // 20 swaps through the admin API, the operator's way in.
  auto admin = AdminStub(s);
  constexpr int64_t kVersions = 21;
  for (int64_t v = 2; v <= kVersions; ++v) {
    ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(v)), v);
    knnd::v1::ReloadIndexResponse reloaded;
    grpc::ClientContext context;
    grpc::Status status = admin->ReloadIndex(
        &context, knnd::v1::ReloadIndexRequest(), &reloaded);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(reloaded.version(), v);
    EXPECT_EQ(reloaded.previous_version(), v - 1);
    EXPECT_TRUE(reloaded.loaded());
    // Let requests run on the new version before the next swap.
    const int64_t before = answered.load();
    while (answered.load() < before + 20) absl::SleepFor(absl::Milliseconds(1));
  }
  stop = true;
  for (std::thread& t : clients) t.join();

  absl::MutexLock lock(&mu);
  EXPECT_THAT(failures, ::testing::IsEmpty());
  EXPECT_GT(answered.load(), 20 * (kVersions - 1));
  EXPECT_EQ(versions_seen.count(kVersions), 1u);
  EXPECT_EQ(Reloads(s, "ok"), static_cast<double>(kVersions));
  EXPECT_EQ(Reloads(s, "failed"), 0);
}

// A truncated, a wrong-dimension and a wrong-metric version are each
// refused, counted and explained, while the version before keeps serving.
TEST(IndexManager, RefusesBadVersionsAndKeepsServing) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  IndexManager& manager = s.server->index_manager();

  // Truncated: written by hand, with a sidecar that matches the cut file,
  // since PublishVersion would refuse it.
  fs::create_directories(dir + "/2.tmp");
  WriteIndex(dir + "/2.tmp/index.faiss", VersionSpec(2));
  fs::resize_file(dir + "/2.tmp/index.faiss",
                  fs::file_size(dir + "/2.tmp/index.faiss") * 3 / 4);
  WriteSidecar(dir + "/2.tmp/index.faiss", kDim, "l2", kRows);
  fs::rename(dir + "/2.tmp", dir + "/2");
  absl::StatusOr<IndexManager::Outcome> outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(), HasSubstr("index version 2"));
  EXPECT_THAT(outcome.status().message(), HasSubstr("still serving version 1"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Reloads(s, "failed"), 1);

  IndexSpec wrong_dim = VersionSpec(3);
  wrong_dim.d = 8;
  ASSERT_EQ(PublishIndex(tmp, dir, wrong_dim), 3);
  outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(), HasSubstr("dim=8 differs from dim=16"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Reloads(s, "failed"), 2);

  IndexSpec wrong_metric = VersionSpec(4);
  wrong_metric.inner_product = true;
  ASSERT_EQ(PublishIndex(tmp, dir, wrong_metric), 4);
  outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(),
              HasSubstr("metric inner_product differs from metric l2"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Reloads(s, "failed"), 3);

  // Asked again, the refused version is not loaded again.
  outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(), HasSubstr("index version 4"));
  EXPECT_EQ(Reloads(s, "failed"), 3);

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(5)), 5);
  outcome = manager.Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->version, 5);
  EXPECT_EQ(ServedVersion(s), 5);
  EXPECT_EQ(Reloads(s, "ok"), 2);
}

// Pinning an older version rolls back and holds until unpinned.
TEST(IndexManager, PinnedVersionRollsBack) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  PublishIndex(tmp, dir, VersionSpec(1));
  PublishIndex(tmp, dir, VersionSpec(2));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  IndexManager& manager = s.server->index_manager();
  EXPECT_EQ(ServedVersion(s), 2);

  absl::StatusOr<IndexManager::Outcome> outcome = manager.ReloadVersion(1);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(ServedVersion(s), 1);
  PublishIndex(tmp, dir, VersionSpec(3));
  outcome = manager.Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->version, 1);
  EXPECT_FALSE(outcome->loaded);

  EXPECT_FALSE(manager.ReloadVersion(9).ok());
  EXPECT_EQ(ServedVersion(s), 1);

  outcome = manager.ReloadVersion(0);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->version, 3);
  EXPECT_EQ(ServedVersion(s), 3);
}

// The old file stays mapped while a request holds its snapshot and is
// unmapped when the last holder lets go.
TEST(IndexManager, OldVersionUnmappedAfterItsLastRequest) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  const std::string v1 = dir + "/1/index.faiss";
  const std::string v2 = dir + "/2/index.faiss";
  EXPECT_TRUE(Mapped(v1));

  std::shared_ptr<const IndexSnapshot> in_flight = s.server->holder().Pin();
  PublishIndex(tmp, dir, VersionSpec(2));
  ASSERT_TRUE(s.server->index_manager().Reload().ok());
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_TRUE(Mapped(v1));
  EXPECT_TRUE(Mapped(v2));

  in_flight.reset();
  EXPECT_FALSE(Mapped(v1));
  EXPECT_TRUE(Mapped(v2));
}

// Reloads asked for at once load the new version once: the initial load
// plus one.
TEST(IndexManager, ConcurrentReloadsLoadOnce) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  PublishIndex(tmp, dir, VersionSpec(2));

  std::atomic<int> loaded{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<IndexManager::Outcome> outcome =
          s.server->index_manager().Reload();
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      EXPECT_EQ(outcome->version, 2);
      if (outcome->loaded) ++loaded;
    });
  }
  // SIGHUP's way in, racing the others.
  s.server->index_manager().RequestReload();
  for (std::thread& t : threads) t.join();
  EXPECT_LE(loaded.load(), 1);
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_EQ(Reloads(s, "ok"), 2);
}

// SIGHUP's path (RequestReload) and polling both bring a new version in.
TEST(IndexManager, RequestedAndPolledReloadsServeTheNewVersion) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  RunningServer s = ServeVersionOne(tmp, dir);
  ASSERT_NE(s.stub, nullptr);
  PublishIndex(tmp, dir, VersionSpec(2));
  s.server->index_manager().RequestReload();
  while (ServedVersion(s) != 2) absl::SleepFor(absl::Milliseconds(5));

  knnd::v1::ServerConfig polling = TestConfig(dir);
  polling.set_index_poll_interval_ms(10);
  RunningServer polled = StartServer(polling);
  ASSERT_NE(polled.stub, nullptr);
  EXPECT_EQ(ServedVersion(polled), 2);
  PublishIndex(tmp, dir, VersionSpec(3));
  while (ServedVersion(polled) != 3) absl::SleepFor(absl::Milliseconds(5));
}

// "before_serving" refuses a changed first version at start-up; "off"
// serves it and never reads it whole.
TEST(IndexManager, ChecksumCheckBeforeServingAndOff) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  PublishIndex(tmp, dir, VersionSpec(1));
  FlipByteFromEnd(dir + "/1/index.faiss", 4);  // of the last id

  knnd::v1::ServerConfig before = TestConfig(dir);
  before.set_checksum_check("before_serving");
  ASSERT_TRUE(ValidateConfig(before).ok());
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(before);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Start().ok());
  const absl::Status loaded = (*server)->LoadIndex();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_THAT(loaded.message(), HasSubstr("CRC-32"));
  EXPECT_EQ((*server)->holder().Pin(), nullptr);

  knnd::v1::ServerConfig off = TestConfig(dir);
  off.set_checksum_check("off");
  RunningServer s = StartServer(off);
  ASSERT_NE(s.stub, nullptr);
  EXPECT_TRUE(s.server->index_manager()
                  .AwaitBackgroundCheck(absl::Now() + absl::Seconds(60))
                  .ok());
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(ChecksumState(s), "unchecked");

  knnd::v1::ServerConfig bad = TestConfig(dir);
  bad.set_checksum_check("later");
  const absl::Status refused = ValidateConfig(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("checksum_check=\"later\""));
}

// keep_previous_versions: the replaced version stays loaded, so a rollback
// to it is immediate and works with its files gone.
TEST(IndexManager, RetainedVersionRollsBackWithoutItsFiles) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  PublishIndex(tmp, dir, VersionSpec(1));
  knnd::v1::ServerConfig config = TestConfig(dir);
  config.set_keep_previous_versions(1);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  auto admin = AdminStub(s);
  const std::string v1 = fs::canonical(dir + "/1/index.faiss").string();
  ASSERT_TRUE(s.server->index_manager()
                  .AwaitBackgroundCheck(absl::Now() + absl::Seconds(60))
                  .ok());

  PublishIndex(tmp, dir, VersionSpec(2));
  knnd::v1::ReloadIndexResponse reloaded;
  ASSERT_TRUE(ReloadRpc(*admin, absl::nullopt, &reloaded).ok());
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_TRUE(Mapped(v1));  // retained, not unmapped
  fs::remove_all(dir + "/1");

  grpc::Status status = ReloadRpc(*admin, 1, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 1);
  EXPECT_FALSE(reloaded.loaded());
  EXPECT_EQ(ServedVersion(s), 1);
  // Its background check's outcome is remembered with it.
  EXPECT_EQ(ChecksumState(s), "verified");

  knnd::v1::ListVersionsResponse listed;
  grpc::ClientContext context;
  ASSERT_TRUE(admin->ListVersions(&context, {}, &listed).ok());
  ASSERT_EQ(listed.versions_size(), 2);
  EXPECT_TRUE(listed.versions(0).serving());   // 1, from memory only
  EXPECT_TRUE(listed.versions(1).retained());  // 2, replaced by the rollback

  status = ReloadRpc(*admin, 0, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 2);
  EXPECT_FALSE(reloaded.loaded());
  EXPECT_EQ(Reloads(s, "ok"), 2);  // the first load and version 2's
}

int64_t AnonBytes() {
  return ReadProcessStats("/proc").resident_anonymous_bytes.value_or(-1);
}

// After a swap, once the requests on the old version end, its heap (a
// 4 MiB precomputed table here) is given back: anonymous memory returns to
// its level before the swap.
TEST(IndexManager, AnonymousMemoryReturnsAfterASwap) {
  if (!::knnd::testing::kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator keeps freed memory (quarantine)";
  }
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  auto spec = [](int64_t version) {
    IndexSpec spec = VersionSpec(version);
    spec.n = 10000;
    spec.d = 16;
    spec.factory = "IVF256,PQ16";  // table: 256 lists x 16 x 256 x 4 B = 4 MiB
    return spec;
  };
  PublishIndex(tmp, dir, spec(1));
  knnd::v1::ServerConfig config = TestConfig(dir);
  config.set_warmup_queries(0);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  const int64_t table = s.server->holder().Pin()->info().precomputed_table_bytes;
  ASSERT_EQ(table, 4 << 20);
  PublishIndex(tmp, dir, spec(2));

  const int64_t before = AnonBytes();
  std::shared_ptr<const IndexSnapshot> in_flight = s.server->holder().Pin();
  ASSERT_TRUE(s.server->index_manager().Reload().ok());
  const int64_t both = AnonBytes();
  in_flight.reset();
  const int64_t after = AnonBytes();
  EXPECT_GE(both - before, table * 3 / 4) << "both versions' tables resident";
  EXPECT_LT(std::abs(after - before), table / 4)
      << "before " << before << ", after " << after;
}

// An index with its own ids swaps with its id table: each version answers
// with its own ids, and a version whose id table was damaged after it was
// published is refused while the one before keeps serving.
TEST(IndexManager, OwnIdsSwapWithTheirIdTable) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  std::vector<std::set<int64_t>> own(4);
  for (int v = 1; v <= 3; ++v) {
    knnd::testing::BuildSpec spec;
    spec.n = 1000;
    spec.d = 16;
    for (int64_t row = 0; row < spec.n; ++row) {
      spec.ids.push_back(v * kVersionIdStride * 1000 + 7 * row + 3);
    }
    own[v].insert(spec.ids.begin(), spec.ids.end());
    const std::string path = tmp.path(absl::StrCat("v", v, ".index"));
    knnd::testing::BuildIndex(path, spec);
    if (v == 1) {
      ASSERT_TRUE(PublishVersion(dir, path).ok());
    }
  }
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  auto answers_in = [&](const std::set<int64_t>& ids) {
    knnd::v1::SearchResponse response;
    grpc::Status status = knnd::testing::CallSearch(*s.stub, Request(7),
                                                    &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_GT(response.ids_size(), 0);
    for (int64_t id : response.ids()) {
      if (id >= 0 && ids.count(id) == 0) return false;
    }
    return true;
  };
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_TRUE(answers_in(own[1]));

  IndexManager& manager = s.server->index_manager();
  ASSERT_TRUE(PublishVersion(dir, tmp.path("v2.index")).ok());
  absl::StatusOr<IndexManager::Outcome> outcome = manager.Reload();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_TRUE(answers_in(own[2]));

  ASSERT_TRUE(PublishVersion(dir, tmp.path("v3.index")).ok());
  FlipByteFromEnd(dir + "/3/index.faiss.ids", 9);
  outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(), HasSubstr("index.faiss.ids"));
  EXPECT_THAT(outcome.status().message(), HasSubstr("still serving version 2"));
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_TRUE(answers_in(own[2]));
}

MemoryBudget::Options BudgetOptions(int64_t limit_bytes) {
  MemoryBudget::Options options;
  options.configured_limit_bytes = limit_bytes;
  options.headroom_bytes = 0;
  return options;
}

// A manager over the versions in `dir` driving a memory budget of
// `limit_bytes` over its own gate, with metrics that serve no port.
struct ManagerWithParts {
  std::unique_ptr<Metrics> metrics;
  IndexHolder holder;
  AdmissionGate gate{AdmissionGate::Options{}};
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<IndexManager> manager;
};

void StartManager(const std::string& dir, int64_t limit_bytes,
                  ManagerWithParts& out) {
  out.budget =
      MemoryBudget::Create(BudgetOptions(limit_bytes), &out.gate, &out.holder);
  out.metrics = knnd::testing::IdleMetrics();
  ASSERT_NE(out.metrics, nullptr);
  IndexManager::Options options;
  options.index_path = dir;
  options.keep_previous_versions = 1;
  options.load.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<IndexManager>> manager = IndexManager::Create(
      options, &out.holder, out.metrics.get(), {out.budget.get(), nullptr});
  ASSERT_TRUE(manager.ok()) << manager.status();
  out.manager = std::move(*manager);
}


// The swap drives the memory budget it is given: the gate's byte budget is
// set once a version serves, for that version, a retained one republished
// by a rollback included.
TEST(IndexManagerParts, TheByteBudgetFollowsTheServingVersion) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  ManagerWithParts m;
  StartManager(dir, int64_t{1} << 30, m);
  AdmissionGate& gate = m.gate;
  // Nothing serves: the gate's own default.
  const int64_t unset = AdmissionGate::Options().max_inflight_bytes;
  ASSERT_EQ(gate.max_inflight_bytes(), unset);

  // What the budget sets for the version serving, computed on a gate of
  // its own.
  auto expected = [&] {
    AdmissionGate reference(AdmissionGate::Options{});
    MemoryBudget::Create(BudgetOptions(int64_t{1} << 30), &reference,
                         &m.holder)
        ->SetByteBudgetFor(m.holder.Pin()->info());
    return reference.max_inflight_bytes();
  };
  ASSERT_TRUE(m.manager->Reload().ok());
  EXPECT_NE(gate.max_inflight_bytes(), unset);
  EXPECT_EQ(gate.max_inflight_bytes(), expected());

  // A larger version 2, then a rollback to the retained version 1.
  IndexSpec big = VersionSpec(2);
  big.n *= 4;
  ASSERT_EQ(PublishIndex(tmp, dir, big), 2);
  ASSERT_TRUE(m.manager->Reload().ok());
  EXPECT_EQ(m.holder.Pin()->info().version, 2);
  EXPECT_EQ(gate.max_inflight_bytes(), expected());
  gate.SetMaxInflightBytes(1);  // so that the rollback must set it again
  absl::StatusOr<IndexManager::Outcome> back = m.manager->ReloadVersion(1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->loaded);  // republished from the retained versions
  EXPECT_EQ(m.holder.Pin()->info().version, 1);
  EXPECT_EQ(gate.max_inflight_bytes(), expected());
}

// A version whose heap does not fit the limit is refused before its heap is
// allocated, and nothing is published.
TEST(IndexManagerParts, AVersionBeyondTheMemoryLimitIsRefused) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  ManagerWithParts m;
  StartManager(dir, 4096, m);
  const AdmissionGate& gate = m.gate;
  absl::StatusOr<IndexManager::Outcome> served = m.manager->Reload();
  EXPECT_TRUE(absl::IsResourceExhausted(served.status())) << served.status();
  EXPECT_EQ(m.holder.Pin(), nullptr);
  EXPECT_EQ(gate.max_inflight_bytes(),
            AdmissionGate::Options().max_inflight_bytes)
      << "a budget set for a version that never served";
}

}  // namespace
}  // namespace knnd
