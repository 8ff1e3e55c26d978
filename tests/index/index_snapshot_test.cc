// IndexSnapshot: answers equal FAISS's on the same file, what it reports,
// the files it refuses (unsupported, truncated, corrupt, a sidecar of
// another index) without crashing, the heap check before the heavy part of
// loading, and the raw-vectors file it maps beside the index.
#include "knnd/index/index_snapshot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <faiss/index_factory.h>
#include <faiss/index_io.h>

#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vectors_file.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::PokeByte;
using ::knnd::testing::ReadFile;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::SearchResults;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIndex;
using ::knnd::testing::WriteVectorsFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

void ExpectSameAsFaiss(const std::string& path, const IndexSpec& spec) {
  auto snapshot = LoadSnapshot(path);
  ASSERT_NE(snapshot, nullptr);
  for (int nq : {1, 100}) {
    std::vector<float> queries = MakeData(nq, spec.d, 99);
    for (int nprobe : {1, 8}) {
      SearchResults got = SearchSnapshot(*snapshot, queries, 10, nprobe);
      std::vector<float> want_d;
      std::vector<int64_t> want_i;
      ReferenceSearch(path, queries, 10, nprobe, &want_d, &want_i);
      EXPECT_EQ(got.ids, want_i) << "nq=" << nq << " nprobe=" << nprobe;
      EXPECT_THAT(got.distances,
                  ::testing::Pointwise(::testing::FloatNear(1e-3), want_d));
    }
  }
}

TEST(IndexSnapshot, L2ResultsEqualFaissOnTheSameFile) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("l2.index"), spec);
  ExpectSameAsFaiss(tmp.path("l2.index"), spec);
}

TEST(IndexSnapshot, InnerProductBehindOpqEqualsFaiss) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "OPQ8,IVF32,PQ8";
  spec.inner_product = true;
  WriteIndex(tmp.path("ip.index"), spec);
  ExpectSameAsFaiss(tmp.path("ip.index"), spec);
  auto snapshot = LoadSnapshot(tmp.path("ip.index"));
  EXPECT_EQ(snapshot->info().metric, Metric::kInnerProduct);
  EXPECT_TRUE(snapshot->info().has_pretransform);
}

TEST(IndexSnapshot, ReportsStructureAndMemory) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 3000;
  spec.d = 32;
  spec.factory = "IVF16,PQ4";
  spec.nprobe = 5;
  WriteIndex(tmp.path("a.index"), spec);
  auto s = LoadSnapshot(tmp.path("a.index"));
  const IndexInfo& info = s->info();
  EXPECT_EQ(info.dim, 32);
  EXPECT_EQ(info.ntotal, 3000);
  EXPECT_EQ(info.nlist, 16);
  EXPECT_EQ(info.pq_m, 4);
  EXPECT_EQ(info.pq_nbits, 8);
  EXPECT_EQ(info.code_size_bytes, 4);
  EXPECT_EQ(info.stored_nprobe, 5);
  EXPECT_EQ(info.index_type, "IVF16,PQ4");
  EXPECT_EQ(info.mapped_list_bytes, 3000 * (4 + 8));
  // centroids 16*32*4 + codebooks 4*256*8*4 + precomputed 16*4*256*4
  EXPECT_EQ(info.precomputed_table_bytes, 16 * 4 * 256 * 4);
  EXPECT_EQ(info.heap_bytes, 16 * 32 * 4 + 256 * 32 * 4 + 16 * 4 * 256 * 4);
  LoadOptions no_table;
  no_table.use_precomputed_table = false;
  auto lean = LoadSnapshot(tmp.path("a.index"), no_table);
  EXPECT_EQ(lean->info().precomputed_table_bytes, 0);
  // Same answers without the table.
  std::vector<float> q = MakeData(20, 32, 5);
  EXPECT_EQ(SearchSnapshot(*s, q, 5, 4).ids,
            SearchSnapshot(*lean, q, 5, 4).ids);
}

TEST(IndexSnapshot, AllowListReturnsOnlyAllowedIdsAndPadsTheRest) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("f.index"), spec);
  auto s = LoadSnapshot(tmp.path("f.index"));
  std::vector<int64_t> allowed = {3, 17, 256, 1024, 4095};
  std::vector<float> q = MakeData(10, spec.d, 8);
  SearchResults r =
      SearchSnapshot(*s, q, 8, static_cast<int>(s->info().nlist), 0, allowed);
  const std::set<int64_t> ok(allowed.begin(), allowed.end());
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 8; ++j) {
      const int64_t id = r.ids[i * 8 + j];
      if (j < 5) {
        EXPECT_TRUE(ok.count(id)) << "query " << i << " got id " << id;
      } else {
        // Only 5 ids exist: the tail is padding.
        EXPECT_EQ(id, -1);
        EXPECT_EQ(r.distances[i * 8 + j], std::numeric_limits<float>::infinity());
      }
    }
  }
}

TEST(IndexSnapshot, MissingFileIsNotFound) {
  auto s = IndexSnapshot::Load("/nonexistent/x.index", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("/nonexistent/x.index"));
}

TEST(IndexSnapshot, RefusesTypesItCannotServeAndSaysWhy) {
  TempDir tmp;
  struct Case {
    std::string factory;
    std::string why;
  } cases[] = {
      {"IVF32,PQ8x4fs", "FastScan"},
      {"IVF32,Flat", "IVF-PQ indexes only"},
      {"Flat", "not an inverted-file index"},
      {"HNSW8", "not an inverted-file index"},
  };
  for (const Case& c : cases) {
    IndexSpec spec;
    spec.n = 2000;
    spec.factory = c.factory;
    const std::string path = tmp.path("t.index");
    std::vector<float> x = MakeData(spec.n, spec.d, 1);
    std::unique_ptr<faiss::Index> index(
        faiss::index_factory(spec.d, c.factory.c_str()));
    index->train(spec.n, x.data());
    index->add(spec.n, x.data());
    faiss::write_index(index.get(), path.c_str());
    auto s = IndexSnapshot::Load(path, {});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << c.factory << ": " << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr(c.why)) << c.factory;
  }
}

// Loads `path` and searches it in a child process, so that a crash shows as
// a signal instead of killing the test. Returns the child's wait status.
int LoadAndSearchInChild(const std::string& path, bool probe) {
  pid_t pid = fork();
  if (pid == 0) {
    LoadOptions options;
    options.probe_in_subprocess = probe;
    auto s = IndexSnapshot::Load(path, options);
    if (s.ok()) {
      std::vector<float> q = MakeData(4, (*s)->info().dim, 3);
      std::vector<float> d(4 * 10);
      std::vector<int64_t> ids(4 * 10);
      SearchArgs args{q.data(), 4, 10, static_cast<int>((*s)->info().nlist),
                      {}, d.data(), ids.data()};
      (void)(*s)->Search(args);
      _exit(0);
    }
    _exit(s.status().message().empty() ? 3 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(IndexSnapshot, TruncatedFilesAreRefusedWithoutACrash) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("full.index"), spec);
  const std::string full = ReadFile(tmp.path("full.index"));
  const std::string path = tmp.path("cut.index");
  for (size_t keep : {size_t{0}, size_t{3}, size_t{40}, full.size() / 10,
                      full.size() / 2, full.size() - 100, full.size() - 1}) {
    WriteFile(path, full.substr(0, keep));
    auto s = IndexSnapshot::Load(path, {});
    EXPECT_FALSE(s.ok()) << "kept " << keep << " of " << full.size();
    EXPECT_THAT(s.status().message(), HasSubstr(path));
    // Without the probe, the structural checks alone must hold.
    const int status = LoadAndSearchInChild(path, /*probe=*/false);
    EXPECT_TRUE(WIFEXITED(status)) << "kept " << keep << ": child died of "
                                   << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 1) << "kept " << keep;
  }
}

// A flag byte that is neither 0 nor 1 (found by the index loader fuzzer
// under UBSan: FAISS's reader copies it into a bool as it is) is refused as
// corruption, never read as a bool.
TEST(IndexSnapshot, NonBooleanFlagBytesAreRefused) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  std::string bytes = ReadFile(tmp.path("good.index"));
  // "IwPQ", then the index header: d (4 bytes), ntotal and two dummies
  // (8 each), is_trained (1).
  constexpr size_t kIsTrained = 4 + 4 + 8 + 8 + 8;
  ASSERT_EQ(bytes.substr(0, 4), "IwPQ");
  ASSERT_EQ(bytes[kIsTrained], 1);
  bytes[kIsTrained] = static_cast<char>(176);
  WriteFile(tmp.path("flag.index"), bytes);
  for (bool probe : {true, false}) {
    LoadOptions options;
    options.probe_in_subprocess = probe;
    auto s = IndexSnapshot::Load(tmp.path("flag.index"), options);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr("is_trained=176"));
  }
}

// A metric outside faiss::MetricType's range, in the index's header or in its
// coarse quantizer's, is refused before it is read as the enum (the index
// loader fuzzer, UBSan -fsanitize=enum). FAISS reads one extra float
// (metric_arg) after a metric other than L2 or inner product, so the corrupt
// files below carry one: the rest of the file then parses.
TEST(IndexSnapshot, OutOfRangeMetricsAreRefused) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  const std::string good = ReadFile(tmp.path("good.index"));
  // "IwPQ" + d (4) + ntotal and two dummies (8 each) + is_trained (1).
  constexpr size_t kIndexMetric = 4 + 4 + 8 + 8 + 8 + 1;
  // Then nlist and nprobe (8 each), the quantizer's "IxF2" and its header.
  constexpr size_t kQuantizerMetric = kIndexMetric + 4 + 8 + 8 + 4 + 4 + 8 +
                                      8 + 8 + 1;
  ASSERT_EQ(good.substr(kQuantizerMetric - 29 - 4, 4), "IxF2");
  struct Case {
    size_t offset;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {kIndexMetric, absl::StatusCode::kInvalidArgument,
       "uses FAISS metric 1000000"},
      {kQuantizerMetric, absl::StatusCode::kDataLoss,
       "coarse quantizer's metric is 1000000"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    int32_t metric;
    std::memcpy(&metric, bad.data() + c.offset, sizeof(metric));
    ASSERT_EQ(metric, 1) << "expected METRIC_L2 at offset " << c.offset;
    metric = 1000000;
    std::memcpy(bad.data() + c.offset, &metric, sizeof(metric));
    const float metric_arg = 0;
    bad.insert(c.offset + sizeof(metric),
               std::string(reinterpret_cast<const char*>(&metric_arg),
                           sizeof(metric_arg)));
    WriteFile(tmp.path("metric.index"), bad);
    for (bool probe : {true, false}) {
      LoadOptions options;
      options.probe_in_subprocess = probe;
      auto s = IndexSnapshot::Load(tmp.path("metric.index"), options);
      ASSERT_FALSE(s.ok()) << "offset " << c.offset;
      EXPECT_EQ(s.status().code(), c.code) << s.status();
      EXPECT_THAT(s.status().message(), HasSubstr(c.message));
    }
  }
}

TEST(IndexSnapshot, ByteFlippedFilesNeverCrashTheLoader) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 2000;
  WriteIndex(tmp.path("good.index"), spec);
  const std::string good = ReadFile(tmp.path("good.index"));
  const std::string path = tmp.path("flipped.index");
  std::mt19937 rng(77);
  // Every byte of the header region, then random positions in the rest.
  std::vector<size_t> positions;
  for (size_t i = 0; i < 200 && i < good.size(); ++i) positions.push_back(i);
  std::uniform_int_distribution<size_t> anywhere(0, good.size() - 1);
  for (int i = 0; i < 100; ++i) positions.push_back(anywhere(rng));
  int refused = 0;
  for (size_t pos : positions) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0xA5);
    WriteFile(path, bad);
    const int status = LoadAndSearchInChild(path, /*probe=*/true);
    ASSERT_TRUE(WIFEXITED(status))
        << "flip at byte " << pos << " killed the loader with signal "
        << WTERMSIG(status);
    if (WEXITSTATUS(status) == 1) ++refused;
  }
  // Flips in the header are caught; flips inside codes or ids are harmless.
  EXPECT_GT(refused, 50);
}

TEST(IndexMetadata, SidecarOfAnotherIndexIsRefused) {
  TempDir dir;
  BuildSpec cosine;
  cosine.metric = Metric::kCosine;
  BuildIndex(dir.path("a.index"), BuildSpec{});
  BuildIndex(dir.path("b.index"), cosine);
  std::rename(MetadataPath(dir.path("b.index")).c_str(),
              MetadataPath(dir.path("a.index")).c_str());
  LoadOptions options;
  options.verify_checksum = false;  // reach the description check
  auto loaded = IndexSnapshot::Load(dir.path("a.index"), options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("does not describe"));
}

TEST(IndexHeapCheck, SeesThePlannedTableBeforeItIsBuiltAndCanRefuse) {
  TempDir tmp;
  IndexSpec spec;  // IVF64,PQ8 over 6000 vectors of 32 dimensions
  spec.n = 6000;
  spec.factory = "IVF64,PQ8";
  WriteIndex(tmp.path("a.index"), spec);
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


constexpr int kRows = 2000;
constexpr int kDim = 16;
constexpr int kK = 10;

// What a loader checks besides the index itself: each test owns a fresh
// index of knnd's builder over MakeData(kRows, kDim, 5) (IVF16,PQ4) and
// its float32 raw-vectors file, to damage or replace.
class BadVectorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuildSpec spec;
    spec.n = kRows;
    spec.d = kDim;
    spec.seed = 5;
    spec.factory = "IVF16,PQ4";
    spec.vectors = VectorsDtype::kFloat32;
    base_ = BuildIndex(tmp_.path("x.index"), spec);
    path_ = VectorsPath(tmp_.path("x.index"));
  }

  TempDir tmp_;
  std::vector<float> base_;
  std::string path_;
};

// Loaded without verify_checksum (checksum_check "background"), a snapshot
// verifies later what Load() skipped: the index file against its sidecar
// and the vectors payload against its header; a cancelled check says so.
TEST_F(BadVectorsFileTest, VerifyChecksumsChecksWhatLoadSkipped) {
  LoadOptions unchecked;
  unchecked.verify_checksum = false;
  auto good = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->info().has_metadata);
  EXPECT_TRUE((*good)->info().has_vectors);
  EXPECT_TRUE((*good)->VerifyChecksums().ok());
  std::atomic<bool> cancel{true};
  EXPECT_TRUE(absl::IsCancelled((*good)->VerifyChecksums(&cancel)));

  PokeByte(path_, kVectorsHeaderBytes + 7, 0x55);
  auto changed = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(changed.ok()) << changed.status();
  absl::Status s = (*changed)->VerifyChecksums();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));

  // The index file itself: one byte of its last stored id.
  ASSERT_TRUE(
      WriteVectorsFile(path_, base_, kDim, VectorsDtype::kFloat32).ok());
  FlipByteFromEnd(tmp_.path("x.index"), 4);
  auto index_changed = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(index_changed.ok()) << index_changed.status();
  s = (*index_changed)->VerifyChecksums();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("x.index.meta.json"),
                                 HasSubstr("CRC-32")));
}

// A vectors file of another index (other count): refused; kOptional serves
// the index alone and says why, kRequired refuses the index.
TEST_F(BadVectorsFileTest, IndexAloneServesUnlessVectorsAreRequired) {
  ASSERT_TRUE(WriteVectorsFile(path_, MakeData(kRows - 1, kDim, 9), kDim,
                               VectorsDtype::kFloat32)
                  .ok());
  LoadOptions optional;
  optional.vectors = VectorsPolicy::kOptional;
  auto alone = LoadSnapshot(tmp_.path("x.index"), optional);
  ASSERT_NE(alone, nullptr);
  EXPECT_FALSE(alone->info().has_vectors);
  EXPECT_THAT(alone->info().vectors_error,
              AllOf(HasSubstr("count=1999"), HasSubstr("ntotal=2000")));
  EXPECT_EQ(SearchSnapshot(*alone, MakeData(3, kDim, 1), kK, 4).ids.size(),
            3u * kK);

  SearchArgs args;
  std::vector<float> q = MakeData(1, kDim, 1);
  std::vector<float> d(kK);
  std::vector<int64_t> ids(kK);
  args = {q.data(), 1, kK, 4, {}, d.data(), ids.data(), 2};
  EXPECT_EQ(alone->Search(args).code(), absl::StatusCode::kFailedPrecondition);

  LoadOptions required;
  required.vectors = VectorsPolicy::kRequired;
  auto refused = IndexSnapshot::Load(tmp_.path("x.index"), required);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("count=1999"),
                    HasSubstr("require_vectors")));

  ASSERT_EQ(unlink(path_.c_str()), 0);
  auto missing = IndexSnapshot::Load(tmp_.path("x.index"), required);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

// knnctl publish copies the vectors file with its index, and refuses one
// that does not match it.
TEST_F(BadVectorsFileTest, PublishCarriesTheVectorsAndChecksThem) {
  auto published = PublishVersion(tmp_.path("versions"), tmp_.path("x.index"));
  ASSERT_TRUE(published.ok()) << published.status();
  LoadOptions required;
  required.vectors = VectorsPolicy::kRequired;
  auto served = LoadSnapshot(published->path, required);
  ASSERT_NE(served, nullptr);
  EXPECT_TRUE(served->info().has_vectors);

  ASSERT_EQ(truncate(path_.c_str(), 1000), 0);
  auto refused = PublishVersion(tmp_.path("versions"), tmp_.path("x.index"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("truncated"));
}

}  // namespace
}  // namespace knnd
