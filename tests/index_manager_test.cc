// Versioned index directories and hot swaps through an in-process server:
// IndexSource, PublishVersion and IndexManager.
#include "knnd/index_manager.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "knnd/index_metadata.h"
#include "knnd/index_source.h"
#include "scrape_util.h"
#include "test_util.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::RunningServer;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

constexpr int kDim = 16;
constexpr int64_t kRows = 1000;
// Version v's vectors have ids v * kIdStride .. v * kIdStride + kRows - 1,
// so every answer says which version produced it.
constexpr int64_t kIdStride = 1000000;

IndexSpec VersionSpec(int64_t version) {
  IndexSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.factory = "IVF16,PQ4x4";
  spec.seed = static_cast<uint32_t>(version);
  spec.first_id = version * kIdStride;
  return spec;
}

// Builds `spec` into a staging file and publishes it into `dir`.
int64_t Publish(const TempDir& tmp, const std::string& dir,
                const IndexSpec& spec) {
  const std::string staging = tmp.path(absl::StrCat("staging.", spec.seed));
  WriteIndex(staging, spec);
  absl::StatusOr<IndexVersion> published = PublishVersion(dir, staging);
  EXPECT_TRUE(published.ok()) << published.status();
  return published.ok() ? published->version : 0;
}

// Writes a sidecar describing `index` as it is, so that only knnd's own
// checks can refuse it.
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

double Reloads(RunningServer& s, const std::string& result) {
  absl::StatusOr<std::string> body =
      knnd::testing::HttpGet(s.server->metrics_port(), "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  if (!body.ok()) return -1;
  return knnd::testing::FindSample(knnd::testing::ParseExposition(*body),
                                   "knnd_index_reloads_total",
                                   {{"result", result}})
      .value_or(-1);
}

knnd::v1::SearchRequest Request(uint32_t seed) {
  std::vector<float> q = MakeData(2, kDim, seed);
  knnd::v1::SearchRequest r;
  *r.mutable_vectors() = {q.begin(), q.end()};
  r.set_k(5);
  return r;
}

int64_t ServedVersion(RunningServer& s) {
  knnd::v1::SearchResponse response;
  grpc::ClientContext context;
  grpc::Status status = s.stub->Search(&context, Request(7), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.index_version();
}

TEST(IndexSource, FileIsVersionOne) {
  TempDir tmp;
  IndexSource source(tmp.path("missing.index"));
  EXPECT_FALSE(source.IsDirectory());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version, 1);
  EXPECT_EQ(latest->path, tmp.path("missing.index"));
}

TEST(IndexSource, ServesHighestCompleteVersion) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  IndexSource source(dir);
  EXPECT_EQ(Publish(tmp, dir, VersionSpec(1)), 1);
  EXPECT_EQ(Publish(tmp, dir, VersionSpec(2)), 2);
  // Ignored: unfinished, without a sidecar, not a number.
  fs::create_directories(dir + "/9.tmp");
  fs::create_directories(dir + "/7");
  fs::copy_file(dir + "/2/index.faiss", dir + "/7/index.faiss");
  fs::create_directories(dir + "/latest");
  ASSERT_TRUE(source.IsDirectory());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version, 2);
  EXPECT_EQ(latest->path, dir + "/2/index.faiss");
  absl::StatusOr<IndexVersion> missing = source.Find(7);
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("complete: 1, 2"));
  // The next number is above every one in use, complete or not.
  EXPECT_EQ(Publish(tmp, dir, VersionSpec(3)), 10);
}

TEST(IndexSource, EmptyDirectoryHasNoVersion) {
  TempDir tmp;
  IndexSource source(tmp.dir());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  EXPECT_TRUE(absl::IsNotFound(latest.status()));
  EXPECT_THAT(latest.status().message(), HasSubstr("no complete version"));
}

TEST(IndexSource, PublishRefusesABrokenFile) {
  TempDir tmp;
  WriteIndex(tmp.path("good.index"), VersionSpec(1));
  fs::resize_file(tmp.path("good.index"),
                  fs::file_size(tmp.path("good.index")) / 2);
  absl::StatusOr<IndexVersion> published =
      PublishVersion(tmp.path("versions"), tmp.path("good.index"));
  EXPECT_FALSE(published.ok());
  EXPECT_TRUE(IndexSource(tmp.path("versions")).List()->empty());
}

// Clients search without pause while versions are published and swapped in:
// no request fails, and every answer's ids belong to the version it names.
TEST(IndexManager, SwapsUnderLoadWithoutFailedRequests) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  Publish(tmp, dir, VersionSpec(1));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> answered{0};
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::set<int64_t> versions_seen;
  std::vector<std::thread> clients;
  for (int c = 0; c < 12; ++c) {
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
            if (id != -1 && (id < v * kIdStride || id >= v * kIdStride + kRows)) {
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

  constexpr int64_t kVersions = 16;
  for (int64_t v = 2; v <= kVersions; ++v) {
    ASSERT_EQ(Publish(tmp, dir, VersionSpec(v)), v);
    absl::StatusOr<IndexManager::Outcome> outcome =
        s.server->index_manager().Reload();
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->version, v);
    EXPECT_TRUE(outcome->loaded);
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
  Publish(tmp, dir, VersionSpec(1));
  RunningServer s = StartServer(TestConfig(dir));
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
  ASSERT_EQ(Publish(tmp, dir, wrong_dim), 3);
  outcome = manager.Reload();
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(outcome.status().message(), HasSubstr("dim=8 differs from dim=16"));
  EXPECT_EQ(ServedVersion(s), 1);
  EXPECT_EQ(Reloads(s, "failed"), 2);

  IndexSpec wrong_metric = VersionSpec(4);
  wrong_metric.inner_product = true;
  ASSERT_EQ(Publish(tmp, dir, wrong_metric), 4);
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

  ASSERT_EQ(Publish(tmp, dir, VersionSpec(5)), 5);
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
  Publish(tmp, dir, VersionSpec(1));
  Publish(tmp, dir, VersionSpec(2));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  IndexManager& manager = s.server->index_manager();
  EXPECT_EQ(ServedVersion(s), 2);

  absl::StatusOr<IndexManager::Outcome> outcome = manager.ReloadVersion(1);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(ServedVersion(s), 1);
  Publish(tmp, dir, VersionSpec(3));
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
  Publish(tmp, dir, VersionSpec(1));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  const std::string v1 = dir + "/1/index.faiss";
  const std::string v2 = dir + "/2/index.faiss";
  EXPECT_TRUE(Mapped(v1));

  std::shared_ptr<const IndexSnapshot> in_flight = s.server->holder().Pin();
  Publish(tmp, dir, VersionSpec(2));
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
  Publish(tmp, dir, VersionSpec(1));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  Publish(tmp, dir, VersionSpec(2));

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
  Publish(tmp, dir, VersionSpec(1));
  RunningServer s = StartServer(TestConfig(dir));
  ASSERT_NE(s.stub, nullptr);
  Publish(tmp, dir, VersionSpec(2));
  s.server->index_manager().RequestReload();
  while (ServedVersion(s) != 2) absl::SleepFor(absl::Milliseconds(5));

  knnd::v1::ServerConfig polling = TestConfig(dir);
  polling.set_index_poll_interval_ms(10);
  RunningServer polled = StartServer(polling);
  ASSERT_NE(polled.stub, nullptr);
  EXPECT_EQ(ServedVersion(polled), 2);
  Publish(tmp, dir, VersionSpec(3));
  while (ServedVersion(polled) != 3) absl::SleepFor(absl::Milliseconds(5));
}

}  // namespace
}  // namespace knnd
