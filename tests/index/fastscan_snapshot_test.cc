// IndexSnapshot serving knnd FastScan files: built by IndexBuilder or
// converted from FAISS's own file, loaded with the probe, searched with
// per-request nprobe and allow-lists as FAISS would, cosine and inner
// product, re-ranked from the vectors file, refused when damaged or not
// converted; the lists stay in the file's mapping, not on the heap.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/faiss/vector_math.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/memory_model.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "testing/fastscan_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FaissSearch;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadBytes;
using ::knnd::testing::ReadFaissIndex;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteBytes;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int kK = 10;

using Results = ::knnd::testing::SearchResults;

std::unique_ptr<IndexSnapshot> MustLoad(const std::string& path,
                                        LoadOptions options = {}) {
  auto loaded = IndexSnapshot::Load(path, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? std::move(*loaded) : nullptr;
}

// FAISS's FastScan file at `faiss_path` converted by ConvertFastScanFile.
void Convert(const std::string& faiss_path, const std::string& path,
             knnd::v1::IndexMetadata metadata = {}) {
  const absl::Status s = ConvertFastScanFile(faiss_path, path, metadata);
  ASSERT_TRUE(s.ok()) << s;
}

// `spec` written by FAISS to NAME.faiss in `tmp` and converted to NAME.index.
void WriteConverted(const TempDir& tmp, const IndexSpec& spec,
                    const std::string& name) {
  WriteIndex(tmp.path(name + ".faiss"), spec);
  Convert(tmp.path(name + ".faiss"), tmp.path(name + ".index"));
}

// Builds `factory` over `base` with IndexBuilder and writes it to `path`.
void Build(const std::string& path, const std::vector<float>& base,
           const std::string& factory, Metric metric) {
  omp_set_num_threads(1);
  IndexBuilder::Options options;
  options.dim = kDim;
  options.metric = metric;
  options.factory = factory;
  auto builder = IndexBuilder::Create(options);
  ASSERT_TRUE(builder.ok()) << builder.status();
  const int64_t rows = static_cast<int64_t>(base.size()) / kDim;
  ASSERT_TRUE((*builder)->Train(base.data(), rows).ok());
  ASSERT_TRUE((*builder)->Add(base.data(), rows, nullptr).ok());
  const absl::Status written = (*builder)->Write(path, 4, {});
  ASSERT_TRUE(written.ok()) << written;
}

// Equal up to the float rounding of FastScan's final rescaling.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;  // the infinite pads too
    EXPECT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::fabs(want[i])))
        << where << " at " << i;
  }
}

bool IsMapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= path.size() &&
        line.compare(line.size() - path.size(), path.size(), path) == 0) {
      return true;
    }
  }
  return false;
}

TEST(FastScanSnapshot, BuiltByIndexBuilderLoadsWithTheProbe) {
  TempDir tmp;
  const std::vector<float> base = MakeData(4000, kDim, 7);
  Build(tmp.path("b.index"), base, "IVF32,PQ16x4fs", Metric::kL2);
  LoadOptions options;
  options.probe_in_subprocess = true;
  auto snapshot = MustLoad(tmp.path("b.index"), options);
  ASSERT_NE(snapshot, nullptr);
  const IndexInfo& info = snapshot->info();
  EXPECT_TRUE(info.fastscan);
  EXPECT_TRUE(info.has_metadata);
  EXPECT_EQ(info.index_type, "IVF32,PQ16x4fs");
  EXPECT_EQ(info.factory, "IVF32,PQ16x4fs");
  EXPECT_EQ(info.ntotal, 4000);
  EXPECT_EQ(info.stored_nprobe, 4);
  EXPECT_TRUE(snapshot->VerifyChecksums().ok());
  // The vectors find themselves among their 10 nearest.
  const std::vector<float> queries(base.begin(), base.begin() + 50 * kDim);
  const Results r = SearchSnapshot(*snapshot, queries, kK, 32);
  int found = 0;
  for (int64_t q = 0; q < 50; ++q) {
    const auto first = r.ids.begin() + q * kK;
    found += std::find(first, first + kK, q) != first + kK;
  }
  EXPECT_GE(found, 45);
}

TEST(FastScanSnapshot, PerRequestNprobeAndAllowListEqualFaiss) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF32,PQ16x4fsr";
  WriteConverted(tmp, spec, "f");
  auto snapshot = MustLoad(tmp.path("f.index"));
  ASSERT_NE(snapshot, nullptr);
  EXPECT_GT(snapshot->info().precomputed_table_bytes, 0);
  auto faiss = ReadFaissIndex(tmp.path("f.faiss"));
  const std::vector<float> queries = MakeData(60, kDim, 99);
  std::vector<int64_t> allowed;
  for (int64_t id = 0; id < spec.n; id += 7) allowed.push_back(id);
  const std::set<int64_t> allowed_set(allowed.begin(), allowed.end());
  for (int nprobe : {1, 8, 32}) {
    std::vector<float> want_d;
    std::vector<int64_t> want_i;
    FaissSearch(*faiss, nprobe, queries, kK, &want_d, &want_i);
    const Results got = SearchSnapshot(*snapshot, queries, kK, nprobe);
    EXPECT_EQ(got.ids, want_i) << "nprobe=" << nprobe;
    ExpectClose(got.distances, want_d, "nprobe=" + std::to_string(nprobe));
    // Filtered: the reference is every candidate of the probed lists,
    // allowed ones first k.
    FaissSearch(*faiss, nprobe, queries, static_cast<int>(spec.n), &want_d,
                &want_i);
    const Results filtered = SearchSnapshot(*snapshot, queries, kK, nprobe, 0, allowed);
    std::vector<float> want_filtered;
    for (int64_t q = 0; q < 60; ++q) {
      std::vector<float> ranked;
      for (int64_t j = 0; j < spec.n && ranked.size() < kK; ++j) {
        const int64_t id = want_i[q * spec.n + j];
        if (id >= 0 && allowed_set.count(id) > 0) {
          ranked.push_back(want_d[q * spec.n + j]);
        }
      }
      ranked.resize(kK, MissingDistance(Metric::kL2));
      want_filtered.insert(want_filtered.end(), ranked.begin(), ranked.end());
      for (size_t j = 0; j < kK; ++j) {
        const int64_t id = filtered.ids[q * kK + j];
        EXPECT_TRUE(id == -1 ? std::isinf(ranked[j])
                             : allowed_set.count(id) == 1)
            << "query " << q << " rank " << j << " id " << id;
      }
    }
    // The same distance at every rank (ties may swap ids).
    ExpectClose(filtered.distances, want_filtered,
                "filtered, nprobe=" + std::to_string(nprobe));
  }
}

TEST(FastScanSnapshot, InnerProductEqualsFaissAndCosineNormalisesQueries) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "OPQ8,IVF32,PQ16x4fs";
  spec.inner_product = true;
  WriteConverted(tmp, spec, "ip");
  auto ip = MustLoad(tmp.path("ip.index"));
  ASSERT_NE(ip, nullptr);
  EXPECT_EQ(ip->info().metric, Metric::kInnerProduct);
  EXPECT_EQ(ip->info().index_type, "LT32_32,IVF32,PQ16x4fs");
  const std::vector<float> queries = MakeData(40, kDim, 5);
  std::vector<float> want_d;
  std::vector<int64_t> want_i;
  FaissSearch(*ReadFaissIndex(tmp.path("ip.faiss")), 8, queries, kK, &want_d,
              &want_i);
  EXPECT_EQ(SearchSnapshot(*ip, queries, kK, 8).ids, want_i);

  Build(tmp.path("cos.index"), MakeData(4000, kDim, 7), "IVF32,PQ16x4fs",
        Metric::kCosine);
  auto cosine = MustLoad(tmp.path("cos.index"));
  ASSERT_NE(cosine, nullptr);
  EXPECT_EQ(cosine->info().metric, Metric::kCosine);
  std::vector<float> scaled = queries;
  for (float& v : scaled) v *= 7.5f;
  const Results a = SearchSnapshot(*cosine, queries, kK, 8);
  const Results b = SearchSnapshot(*cosine, scaled, kK, 8);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_THAT(a.distances, ::testing::Pointwise(::testing::FloatNear(1e-4),
                                                b.distances));
  EXPECT_LE(a.distances[0], 1.01f);  // a cosine
}

TEST(FastScanSnapshot, ConvertingACosineFileRecordsItsMetric) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF32,PQ16x4fs";
  spec.inner_product = true;
  WriteIndex(tmp.path("c.faiss"), spec);
  knnd::v1::IndexMetadata metadata;
  metadata.set_metric("cosine");
  Convert(tmp.path("c.faiss"), tmp.path("c.index"), metadata);
  auto meta = ReadIndexMetadata(MetadataPath(tmp.path("c.index")));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->metric(), "cosine");
  EXPECT_TRUE(meta->normalized());
  EXPECT_EQ(meta->source(), tmp.path("c.faiss"));
  EXPECT_EQ(meta->factory(), "IVF32,PQ16x4fs");
  EXPECT_EQ(meta->ntotal(), spec.n);
  // L2 is not a metric this inner-product file can be served with.
  metadata.set_metric("l2");
  const absl::Status refused =
      ConvertFastScanFile(tmp.path("c.faiss"), tmp.path("l2.index"), metadata);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_FALSE(std::ifstream(tmp.path("l2.index")).good());
}

TEST(FastScanSnapshot, ReRankingWithTheVectorsFileImprovesRecall) {
  TempDir tmp;
  // 100 clusters of about 60: the true neighbours are among the 80
  // candidates of refine_factor 8, in an order 8-byte codes blur.
  const std::vector<float> base = MakeData(6000, kDim, 7, 100);
  Build(tmp.path("r.index"), base, "IVF32,PQ16x4fs", Metric::kL2);
  auto writer = VectorsFileWriter::Create(VectorsPath(tmp.path("r.index")),
                                          kDim, VectorsDtype::kFloat32);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(base.data(), 6000).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  // The version's files written by hand, then bound into it.
  ASSERT_TRUE(SealVersion(tmp.path("r.index"), "test").ok());
  auto snapshot = MustLoad(tmp.path("r.index"));
  ASSERT_NE(snapshot, nullptr);
  ASSERT_TRUE(snapshot->info().has_vectors);
  // Queries near the data: base vectors moved a little.
  std::vector<float> queries(base.begin(), base.begin() + 100 * kDim);
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (float& v : queries) v += noise(rng);
  std::vector<float> true_d(100 * kK);
  std::vector<int64_t> truth(100 * kK);
  ASSERT_TRUE(ExactKnn(base.data(), 6000, queries.data(), 100, kDim, kK,
                       Metric::kL2, true_d.data(), truth.data())
                  .ok());
  const double plain =
      RecallAt(SearchSnapshot(*snapshot, queries, kK, 32).ids, kK, truth, kK, kK);
  const Results reranked = SearchSnapshot(*snapshot, queries, kK, 32, 8);
  const double refined = RecallAt(reranked.ids, kK, truth, kK, kK);
  std::printf("recall@10 FastScan %.3f, re-ranked x8 %.3f\n", plain, refined);
  EXPECT_GT(refined, plain + 0.1);
  EXPECT_GT(refined, 0.95);
  // Re-ranked distances are exact.
  EXPECT_NEAR(reranked.distances[0],
              L2Squared(queries.data(), base.data() + reranked.ids[0] * kDim,
                        kDim),
              1e-3);
}

TEST(FastScanSnapshot, ListsStayInTheFileMappingNotOnTheHeap) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 20000;
  spec.d = 64;
  spec.factory = "IVF16,PQ32x4fs";  // 16-byte codes: 320 kB of codes
  WriteConverted(tmp, spec, "big");
  {
    auto snapshot = MustLoad(tmp.path("big.index"));
    ASSERT_NE(snapshot, nullptr);
    const IndexInfo& info = snapshot->info();
    const int64_t codes = spec.n * info.code_size_bytes;
    EXPECT_GE(info.mapped_list_bytes, codes + spec.n * 8);
    EXPECT_LT(info.heap_bytes, codes / 4) << "the codes are not on the heap";
    EXPECT_TRUE(IsMapped(tmp.path("big.index")));
    SearchSnapshot(*snapshot, MakeData(20, spec.d, 4), kK, 16);
  }
  EXPECT_FALSE(IsMapped(tmp.path("big.index")))
      << "the mapping outlived its snapshot";
}

TEST(FastScanSnapshot, DamagedFilesAreDataLossNamingTheFile) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF32,PQ16x4fs";
  WriteConverted(tmp, spec, "g");
  const std::string good = ReadBytes(tmp.path("g.index"));
  const std::string path = tmp.path("bad.index");
  std::vector<std::string> damaged;
  for (size_t keep : {size_t{0}, size_t{40}, size_t{200}, good.size() / 2,
                      good.size() - 1}) {
    damaged.push_back(good.substr(0, keep));
  }
  std::string flipped = good;
  flipped[300] ^= 0x10;  // the list table or blob: the meta checksum
  damaged.push_back(flipped);
  for (const std::string& bytes : damaged) {
    WriteBytes(path, bytes);
    for (bool probe : {true, false}) {
      LoadOptions options;
      options.probe_in_subprocess = probe;
      auto s = IndexSnapshot::Load(path, options);
      ASSERT_FALSE(s.ok()) << bytes.size() << " bytes, probe " << probe;
      if (bytes.size() >= 8) {  // shorter has no magic: read as FAISS
        EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss)
            << s.status();
      }
      EXPECT_THAT(s.status().message(), HasSubstr(path));
    }
  }
  // A code byte changed: the layout holds, the sidecar's CRC-32 does not.
  std::string code_flipped = good;
  code_flipped[good.size() - 200] ^= 0x10;
  WriteBytes(tmp.path("g.index"), code_flipped);
  auto s = IndexSnapshot::Load(tmp.path("g.index"), {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  LoadOptions later;
  later.verify_checksum = false;
  auto loaded = MustLoad(tmp.path("g.index"), later);
  ASSERT_NE(loaded, nullptr);
  const absl::Status verified = loaded->VerifyChecksums();
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(verified.message(), HasSubstr(tmp.path("g.index")));
}

TEST(FastScanSnapshot, FastScanWrittenByFaissIsRefusedNamingKnnctlConvert) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF32,PQ16x4fs";
  WriteIndex(tmp.path("plain.index"), spec);
  for (bool probe : {true, false}) {
    LoadOptions options;
    options.probe_in_subprocess = probe;
    auto s = IndexSnapshot::Load(tmp.path("plain.index"), options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr("knnctl convert"));
    EXPECT_THAT(s.status().message(), HasSubstr(tmp.path("plain.index")));
  }
}

TEST(FastScanSnapshot, HeapCheckSeesTheReadersTableAndTheTableToBuild) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF32,PQ16x4fsr";
  WriteConverted(tmp, spec, "t");
  const int64_t table = PrecomputedTableBytes(32, 16, 4);
  for (bool use_table : {true, false}) {
    LoadOptions options;
    options.use_precomputed_table = use_table;
    IndexInfo planned;
    options.check_heap = [&](const IndexInfo& p) {
      planned = p;
      return absl::OkStatus();
    };
    auto snapshot = MustLoad(tmp.path("t.index"), options);
    ASSERT_NE(snapshot, nullptr);
    EXPECT_EQ(planned.precomputed_table_bytes, use_table ? table : 0);
    EXPECT_EQ(planned.read_peak_extra_bytes, table);
    EXPECT_EQ(snapshot->info().heap_bytes, planned.heap_bytes);
    // The load's peak holds the reader's table either way.
    EXPECT_EQ(LoadPeakHeapBytes(planned),
              planned.heap_bytes - planned.precomputed_table_bytes + table);
  }
}

TEST(FastScanSnapshot, MemoryModelCountsTheLookUpTables) {
  IndexInfo info;
  info.fastscan = true;
  info.dim = 128;
  info.ivf_dim = 128;
  info.nlist = 256;
  info.pq_m = 64;
  info.pq_nbits = 4;
  info.code_size_bytes = 32;
  SearchShape shape{100, 10, 16, 0, 0, 0};
  const int64_t plain = EstimateSearchBytes(info, shape);
  // Residual L2 codes: one float and one uint8 table per probed list, the
  // inner-product table and the biases.
  info.by_residual = true;
  info.precomputed_table_bytes = PrecomputedTableBytes(256, 64, 4);
  const int64_t residual = EstimateSearchBytes(info, shape);
  EXPECT_EQ(residual - plain, 100 * 15 * (16 * 64 * 4 + 16 * 64) +
                                  100 * 16 * 64 * 4 + 100 * 16 * 6);
  // Twice the rows, twice the bytes, but for the terms of one FAISS call:
  // the coarse norms, the grouped table of <= 24 queries, the handler's
  // order.
  shape.num_queries = 200;
  EXPECT_EQ(EstimateSearchBytes(info, shape),
            2 * residual - (256 * 4 + 24 * 16 * 64 + 10 * 4));
}

}  // namespace
}  // namespace knnd
