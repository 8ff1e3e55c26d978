// IndexSnapshot: answers equal FAISS's on the same file, what it reports,
// the files it refuses (unsupported, truncated, corrupt, a sidecar of
// another index) without crashing, the heap check before the heavy part of
// loading, the raw-vectors file it maps beside the index, and the id table
// of an index built with its own ids.
#include "knnd/index/index_snapshot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <faiss/index_factory.h>
#include <faiss/index_io.h>

#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
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
using ::knnd::testing::ReferenceDistance;
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
  const std::string a_sidecar = ReadFile(MetadataPath(dir.path("a.index")));
  std::rename(MetadataPath(dir.path("b.index")).c_str(),
              MetadataPath(dir.path("a.index")).c_str());
  LoadOptions options;
  options.verify_checksum = false;
  // The manifest binds a.index's own sidecar: another's is refused first.
  auto loaded = IndexSnapshot::Load(dir.path("a.index"), options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr("a.index.meta.json"), HasSubstr("binds")));
  // A sidecar sealed with the file whose metric it misstates: the
  // description check behind the manifest still refuses it.
  WriteFile(MetadataPath(dir.path("a.index")), a_sidecar);
  absl::StatusOr<knnd::v1::IndexMetadata> wrong =
      ReadIndexMetadata(MetadataPath(dir.path("a.index")));
  ASSERT_TRUE(wrong.ok());
  wrong->set_metric("cosine");
  wrong->set_normalized(true);
  ASSERT_TRUE(RewriteSidecar(dir.path("a.index"), *wrong, "test").ok());
  loaded = IndexSnapshot::Load(dir.path("a.index"), options);
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

  // Cut after it was sealed: refused before anything is copied, naming
  // the file and the size its manifest binds.
  ASSERT_EQ(truncate(path_.c_str(), 1000), 0);
  auto refused = PublishVersion(tmp_.path("versions"), tmp_.path("x.index"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("has 1000 bytes"),
                    HasSubstr("binds one of")));
}

// ---- own ids: the id table beside the index ----

// Seeded distinct 63-bit ids, in no order.
std::vector<int64_t> HashIds(int64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() >> 1);
  return ids;
}

// One build with row ids and the same build with own ids (HashIds), each
// with its raw vectors: the lists of the two are the same, so every answer
// of the second must be the first's translated by the id table.
class OwnIdsSnapshotTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BuildSpec spec;
    spec.n = 3000;
    spec.factory = GetParam();
    spec.vectors = VectorsDtype::kFloat32;
    base_ = BuildIndex(tmp_.path("rows.index"), spec);
    ids_ = HashIds(spec.n, 3);
    spec.ids = ids_;
    BuildIndex(tmp_.path("own.index"), spec);
    rows_ = LoadSnapshot(tmp_.path("rows.index"));
    own_ = LoadSnapshot(tmp_.path("own.index"));
    ASSERT_NE(rows_, nullptr);
    ASSERT_NE(own_, nullptr);
  }

  // Per query, the (distance, id) pairs of `got` equal those of `rows`
  // with ids translated (equal distances may order ids differently), and
  // `got` orders equal distances by id, missing ones last. With
  // re-ranking (`refined`) the candidates are the best PQ estimates with
  // equal ones taken by id, not by row: 4-bit estimates tie often, so a
  // few places may hold another candidate; each distance must then still
  // be the exact distance of the id's vector.
  void ExpectTranslated(const SearchResults& rows, const SearchResults& got,
                        int k, const std::vector<float>& queries,
                        bool refined, const std::string& what) {
    ASSERT_EQ(rows.ids.size(), got.ids.size());
    std::map<int64_t, int64_t> row_of;
    for (size_t row = 0; row < ids_.size(); ++row) row_of[ids_[row]] = row;
    int64_t differing = 0;
    for (size_t q = 0; q * k < got.ids.size(); ++q) {
      std::multiset<std::pair<float, int64_t>> want, have;
      for (int j = 0; j < k; ++j) {
        const size_t at = q * k + j;
        const int64_t row = rows.ids[at];
        want.insert({rows.distances[at], row < 0 ? -1 : ids_[row]});
        have.insert({got.distances[at], got.ids[at]});
        if (j > 0 && got.distances[at] == got.distances[at - 1] &&
            got.ids[at] >= 0) {
          EXPECT_LT(got.ids[at - 1], got.ids[at]) << what << " query " << q;
        }
        if (refined && got.ids[at] >= 0) {
          ASSERT_EQ(row_of.count(got.ids[at]), 1u) << what;
          const double exact = ReferenceDistance(
              Metric::kL2, &queries[q * 32],
              &base_[row_of[got.ids[at]] * 32], 32);
          EXPECT_NEAR(got.distances[at], exact, 1e-3 * exact) << what;
        }
      }
      if (!refined) {
        EXPECT_EQ(have, want) << what << " query " << q;
      }
      std::vector<std::pair<float, int64_t>> missing;
      std::set_difference(want.begin(), want.end(), have.begin(), have.end(),
                          std::back_inserter(missing));
      differing += static_cast<int64_t>(missing.size());
    }
    EXPECT_LE(differing, static_cast<int64_t>(got.ids.size()) / 50) << what;
  }

  TempDir tmp_;
  std::vector<float> base_;
  std::vector<int64_t> ids_;
  std::unique_ptr<IndexSnapshot> rows_;
  std::unique_ptr<IndexSnapshot> own_;
};

TEST_P(OwnIdsSnapshotTest, LoadsTheIdTableAndReportsIt) {
  const IndexInfo& info = own_->info();
  EXPECT_TRUE(info.has_id_table);
  EXPECT_EQ(info.id_table_path, IdTablePath(tmp_.path("own.index")));
  EXPECT_EQ(info.id_table_file_bytes, 64 + 24 * 3000);
  EXPECT_TRUE(info.has_vectors);
  EXPECT_FALSE(rows_->info().has_id_table);
  EXPECT_EQ(own_->IdOfRow(17), ids_[17]);
  EXPECT_EQ(rows_->IdOfRow(17), 17);
}

TEST_P(OwnIdsSnapshotTest, AnswersAreTheRowIdAnswersInOwnIds) {
  const std::vector<float> queries = MakeData(50, 32, 99);
  for (int refine : {0, 4}) {
    for (int nprobe : {1, 8}) {
      const std::string what =
          absl::StrCat("nprobe ", nprobe, " refine ", refine);
      ExpectTranslated(SearchSnapshot(*rows_, queries, 10, nprobe, refine),
                       SearchSnapshot(*own_, queries, 10, nprobe, refine), 10,
                       queries, refine > 0, what);
    }
  }
}

TEST_P(OwnIdsSnapshotTest, AllowedIdsAreTheUsersIds) {
  const std::vector<float> queries = MakeData(20, 32, 98);
  // Rows 0, 7, 14, ... by their own ids, plus ids no row holds.
  std::vector<int64_t> allowed_rows;
  std::vector<int64_t> allowed_ids;
  for (int64_t row = 0; row < 3000; row += 7) {
    allowed_rows.push_back(row);
    allowed_ids.push_back(ids_[row]);
    allowed_ids.push_back(ids_[row] ^ 1);
  }
  std::sort(allowed_ids.begin(), allowed_ids.end());
  const std::set<int64_t> allowed(allowed_ids.begin(), allowed_ids.end());
  for (int refine : {0, 4}) {
    const SearchResults got =
        SearchSnapshot(*own_, queries, 10, 8, refine, allowed_ids);
    for (int64_t id : got.ids) {
      EXPECT_TRUE(id == -1 || allowed.count(id) == 1) << id;
    }
    ExpectTranslated(
        SearchSnapshot(*rows_, queries, 10, 8, refine, allowed_rows), got, 10,
        queries, refine > 0, absl::StrCat("filtered, refine ", refine));
  }
  // Only ids the index does not hold: nothing matches, every place padded.
  const std::vector<int64_t> unknown = {ids_[0] ^ 1, ids_[1] ^ 1};
  std::vector<int64_t> sorted_unknown = unknown;
  std::sort(sorted_unknown.begin(), sorted_unknown.end());
  for (int refine : {0, 4}) {
    const SearchResults none =
        SearchSnapshot(*own_, queries, 10, 8, refine, sorted_unknown);
    EXPECT_EQ(std::count(none.ids.begin(), none.ids.end(), -1),
              static_cast<long>(none.ids.size()));
  }
}

// What a shard returns to a merger: every candidate in own ids, with both
// distances, the best estimates first, equal estimates by id.
TEST_P(OwnIdsSnapshotTest, ReturnCandidatesAreInOwnIdsOrderedByEstimateThenId) {
  const std::vector<float> queries = MakeData(30, 32, 97);
  constexpr int kK = 10;
  constexpr int kRefine = 3;
  constexpr int kC = kK * kRefine;
  auto candidates = [&](const IndexSnapshot& snapshot, SearchResults& out,
                        std::vector<float>& approx) {
    out.ids.resize(30 * kC);
    out.distances.resize(30 * kC);
    approx.resize(30 * kC);
    SearchArgs args;
    args.queries = queries.data();
    args.num_queries = 30;
    args.k = kK;
    args.nprobe = 4;
    args.refine_factor = kRefine;
    args.return_candidates = true;
    args.ids = out.ids.data();
    args.distances = out.distances.data();
    args.approx_distances = approx.data();
    ASSERT_TRUE(snapshot.Search(args).ok());
  };
  SearchResults rows, own;
  std::vector<float> rows_approx, own_approx;
  candidates(*rows_, rows, rows_approx);
  candidates(*own_, own, own_approx);
  // The same estimates: which candidates hold them may differ only among
  // equal ones at the last place.
  EXPECT_EQ(own_approx, rows_approx);
  for (int q = 0; q < 30; ++q) {
    std::set<std::tuple<float, float, int64_t>> want, have;
    const float last = rows_approx[q * kC + kC - 1];
    for (int j = 0; j < kC; ++j) {
      const int at = q * kC + j;
      if (j > 0 && own_approx[at] == own_approx[at - 1] && own.ids[at] >= 0) {
        EXPECT_LT(own.ids[at - 1], own.ids[at]) << "query " << q;
      }
      if (rows_approx[at] == last) continue;
      const int64_t row = rows.ids[at];
      want.insert({rows_approx[at], rows.distances[at],
                   row < 0 ? -1 : ids_[row]});
      have.insert({own_approx[at], own.distances[at], own.ids[at]});
    }
    EXPECT_EQ(have, want) << "query " << q;
  }
}

INSTANTIATE_TEST_SUITE_P(PqAndFastScan, OwnIdsSnapshotTest,
                         ::testing::Values("IVF32,PQ8", "IVF32,PQ16x4fs"),
                         [](const auto& info) {
                           return info.param == "IVF32,PQ8" ? "Pq8"
                                                            : "FastScan";
                         });

// Builds a 1000-row index with HashIds(1000, seed) as its ids at `path`;
// returns the ids.
std::vector<int64_t> BuildOwnIdsIndex(const std::string& path, uint32_t seed) {
  BuildSpec spec;
  spec.n = 1000;
  spec.ids = HashIds(spec.n, seed);
  BuildIndex(path, spec);
  return spec.ids;
}

TEST(OwnIdsSnapshot, MissingOrBadIdTableFailsTheLoadNamingIt) {
  TempDir tmp;
  const std::string path = tmp.path("own.index");
  BuildOwnIdsIndex(path, 4);
  const std::string ids = IdTablePath(path);
  const std::string saved = ReadFile(ids);
  LoadOptions options;
  options.probe_in_subprocess = false;

  ASSERT_EQ(std::remove(ids.c_str()), 0);
  absl::Status missing = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), AllOf(HasSubstr(ids), HasSubstr("own ids")));

  WriteFile(ids, saved.substr(0, saved.size() - 8));
  absl::Status truncated = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(truncated.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.message(), HasSubstr("truncated"));

  // Another index's table: count differs.
  ASSERT_TRUE(WriteIdTable(ids, HashIds(999, 4), "other").ok());
  absl::Status other = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("ntotal=1000"));

  // A flipped byte: refused at load, or found later by VerifyChecksums.
  WriteFile(ids, saved);
  FlipByteFromEnd(ids, 100);
  absl::Status corrupt = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.message(), AllOf(HasSubstr(ids), HasSubstr("CRC-32")));
  options.verify_checksum = false;
  std::unique_ptr<IndexSnapshot> unchecked = LoadSnapshot(path, options);
  ASSERT_NE(unchecked, nullptr);
  absl::Status later = unchecked->VerifyChecksums();
  EXPECT_EQ(later.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(later.message(), HasSubstr(ids));
}

// A published version carries its id table; without one the version is
// refused, never served with row numbers for ids.
TEST(OwnIdsSnapshot, PublishCarriesTheIdTable) {
  TempDir tmp;
  const std::string path = tmp.path("own.index");
  const std::vector<int64_t> own = BuildOwnIdsIndex(path, 5);
  const std::string dir = tmp.path("versions");
  absl::StatusOr<IndexVersion> published = PublishVersion(dir, path);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(ReadFile(IdTablePath(published->path)),
            ReadFile(IdTablePath(path)));
  std::unique_ptr<IndexSnapshot> loaded = LoadSnapshot(published->path);
  ASSERT_NE(loaded, nullptr);
  EXPECT_EQ(loaded->IdOfRow(999), own[999]);

  ASSERT_EQ(std::remove(IdTablePath(path).c_str()), 0);
  absl::StatusOr<IndexVersion> without = PublishVersion(dir, path);
  EXPECT_EQ(without.status().code(), absl::StatusCode::kNotFound);
}

// An index with payloads: the snapshot loads them (fields, sizes), cuts a
// result's payload by its answer id (own ids too), refuses payloads of an
// index without them, a damaged or missing payload file, and a published
// version carries them.
TEST(PayloadsSnapshot, LoadsServesAndPublishesThePayloads) {
  TempDir tmp;
  BuildSpec spec;
  spec.n = 1000;
  spec.d = 16;
  spec.factory = "IVF8,PQ4";
  for (int64_t row = 0; row < spec.n; ++row) {
    spec.ids.push_back(1000 * row + 1);
    spec.payloads.push_back(row % 2 == 0
                                ? absl::StrCat("{\"page\": ", row, "}")
                                : absl::StrCat("\"text of ", row, "\""));
  }
  const std::string path = tmp.path("p.index");
  BuildIndex(path, spec);
  std::unique_ptr<IndexSnapshot> loaded = LoadSnapshot(path);
  ASSERT_NE(loaded, nullptr);
  const IndexInfo& info = loaded->info();
  EXPECT_TRUE(info.has_payloads);
  EXPECT_EQ(info.payloads_path, PayloadPath(path));
  EXPECT_EQ(info.payload_fields, (std::vector<std::string>{"page", "text"}));
  EXPECT_EQ(info.max_payload_json_bytes,
            static_cast<int64_t>(std::string("{\"text\":\"text of 999\"}")
                                     .size()));
  absl::StatusOr<PayloadSelection> page =
      loaded->SelectPayloads(false, {std::string("page")});
  ASSERT_TRUE(page.ok()) << page.status();
  std::string json;
  loaded->AppendPayload(1000 * 42 + 1, *page, &json);  // row 42's id
  EXPECT_EQ(json, "{\"page\":42}");
  EXPECT_EQ(loaded->PayloadJsonBytes(1000 * 43 + 1, *page), 2);  // "{}"
  json.clear();
  loaded->AppendPayload(-1, *page, &json);
  loaded->AppendPayload(5, *page, &json);  // no row holds id 5
  EXPECT_EQ(json, "");

  absl::StatusOr<IndexVersion> published =
      PublishVersion(tmp.path("versions"), path);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(ReadFile(PayloadPath(published->path)),
            ReadFile(PayloadPath(path)));

  FlipByteFromEnd(PayloadPath(path), 2);
  LoadOptions options;
  options.probe_in_subprocess = false;
  absl::Status corrupt = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.message(),
              AllOf(HasSubstr(PayloadPath(path)), HasSubstr("CRC-32")));
  options.verify_checksum = false;
  std::unique_ptr<IndexSnapshot> unchecked = LoadSnapshot(path, options);
  ASSERT_NE(unchecked, nullptr);
  EXPECT_EQ(unchecked->VerifyChecksums().code(), absl::StatusCode::kDataLoss);
  ASSERT_EQ(std::remove(PayloadPath(path).c_str()), 0);
  absl::Status missing = IndexSnapshot::Load(path, options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("says the index has payloads"));

  const std::string bare = tmp.path("bare.index");
  spec.payloads.clear();
  BuildIndex(bare, spec);
  std::unique_ptr<IndexSnapshot> without = LoadSnapshot(bare);
  ASSERT_NE(without, nullptr);
  EXPECT_FALSE(without->info().has_payloads);
  absl::Status refused = without->SelectPayloads(true, {}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("has no payloads"));
}

}  // namespace
}  // namespace knnd
