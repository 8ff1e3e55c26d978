#include "knnd/index/index_builder.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <set>

#include <omp.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_eval.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/index/index_snapshot.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::MakeData;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int64_t kRows = 4000;
constexpr int kK = 10;

// Builds `factory` over MakeData(kRows, kDim, 7) and writes it to `path`.
std::vector<float> BuildIndex(const std::string& path, Metric metric,
                              const std::string& factory = "IVF32,PQ8") {
  // One thread: tests share the machine, and OpenMP threads spinning on busy
  // cores made this build take 17 s instead of 2 s.
  omp_set_num_threads(1);
  std::vector<float> x = MakeData(kRows, kDim, 7);
  IndexBuilder::Options options;
  options.dim = kDim;
  options.metric = metric;
  options.factory = factory;
  auto builder = IndexBuilder::Create(options);
  EXPECT_TRUE(builder.ok()) << builder.status();
  EXPECT_TRUE((*builder)->Train(x.data(), kRows).ok());
  // Two batches, the second with the ids that follow the first.
  EXPECT_TRUE((*builder)->Add(x.data(), kRows / 2, nullptr).ok());
  EXPECT_TRUE(
      (*builder)->Add(x.data() + kRows / 2 * kDim, kRows / 2, nullptr).ok());
  knnd::v1::IndexMetadata metadata;
  metadata.set_source("MakeData(4000, 32, 7)");
  absl::Status written = (*builder)->Write(path, 4, metadata);
  EXPECT_TRUE(written.ok()) << written;
  return x;
}

std::vector<int64_t> Search(const IndexSnapshot& snapshot,
                            const std::vector<float>& queries, int nprobe,
                            std::vector<float>* distances = nullptr) {
  const int64_t n = static_cast<int64_t>(queries.size()) / kDim;
  std::vector<int64_t> ids(n * kK);
  std::vector<float> d(n * kK);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = kK;
  args.nprobe = nprobe;
  args.ids = ids.data();
  args.distances = d.data();
  EXPECT_TRUE(snapshot.Search(args).ok());
  if (distances != nullptr) *distances = d;
  return ids;
}

// Exact L2 neighbours by a plain double-precision loop, independent of the
// FAISS flat index that knnctl eval uses.
std::vector<int64_t> BruteForce(const std::vector<float>& base,
                                const std::vector<float>& queries, int k) {
  const int64_t nb = static_cast<int64_t>(base.size()) / kDim;
  const int64_t nq = static_cast<int64_t>(queries.size()) / kDim;
  std::vector<int64_t> out;
  for (int64_t q = 0; q < nq; ++q) {
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t b = 0; b < nb; ++b) {
      double d = 0;
      for (int j = 0; j < kDim; ++j) {
        const double diff = queries[q * kDim + j] - base[b * kDim + j];
        d += diff * diff;
      }
      all.emplace_back(d, b);
    }
    std::partial_sort(all.begin(), all.begin() + k, all.end());
    for (int j = 0; j < k; ++j) out.push_back(all[j].second);
  }
  return out;
}

double Recall(const std::vector<int64_t>& found,
              const std::vector<int64_t>& truth, int k) {
  int64_t hits = 0;
  for (size_t q = 0; q < truth.size() / k; ++q) {
    std::set<int64_t> expected(truth.begin() + q * k,
                               truth.begin() + (q + 1) * k);
    for (int j = 0; j < k; ++j) hits += expected.count(found[q * k + j]);
  }
  return static_cast<double>(hits) / static_cast<double>(truth.size());
}

TEST(IndexBuilder, DefaultsFollowTheDataShape) {
  EXPECT_EQ(DefaultNlist(60000), 1024);  // 4*sqrt(60000) = 980
  EXPECT_EQ(DefaultNlist(1000000), 4096);
  EXPECT_EQ(DefaultNlist(5000), 128);  // 4*sqrt = 283, but 5000/39 = 128
  EXPECT_EQ(DefaultNlist(10), 1);
  EXPECT_EQ(DefaultPqM(784), 56);
  EXPECT_EQ(DefaultPqM(128), 32);
  EXPECT_EQ(DefaultPqM(768), 64);
  EXPECT_EQ(DefaultPqM(3), 1);
  EXPECT_EQ(DefaultTrainRows(60000, 1024), 60000);
  EXPECT_EQ(DefaultTrainRows(10000000, 4096), 204800);
  EXPECT_EQ(DefaultNprobe(1024), 32);
}

TEST(IndexBuilder, BuiltFileLoadsAndSearchesLikeFaissWithSaneRecall) {
  TempDir dir;
  const std::string path = dir.path("x.index");
  const std::vector<float> base = BuildIndex(path, Metric::kL2);
  auto snapshot = IndexSnapshot::Load(path, {});
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  const IndexInfo& info = (*snapshot)->info();
  EXPECT_EQ(info.ntotal, kRows);
  EXPECT_EQ(info.nlist, 32);
  EXPECT_EQ(info.stored_nprobe, 4);
  EXPECT_TRUE(info.has_metadata);
  EXPECT_EQ(info.factory, "IVF32,PQ8");
  EXPECT_EQ(info.source, "MakeData(4000, 32, 7)");

  const std::vector<float> queries = MakeData(100, kDim, 99);
  const std::vector<int64_t> truth = BruteForce(base, queries, kK);
  const std::vector<int64_t> at1 = Search(**snapshot, queries, 1);
  const std::vector<int64_t> at_all = Search(**snapshot, queries, 32);
  std::vector<float> ref_distances;
  std::vector<int64_t> ref_ids;
  ReferenceSearch(path, queries, kK, 32, &ref_distances, &ref_ids);
  EXPECT_EQ(at_all, ref_ids);
  const double recall1 = Recall(at1, truth, kK);
  const double recall_all = Recall(at_all, truth, kK);
  EXPECT_GT(recall_all, recall1);
  // 8-byte codes of 32-d clustered data find over half the true top 10.
  EXPECT_GT(recall_all, 0.5);
  // The library's recall agrees with the one computed here.
  EXPECT_DOUBLE_EQ(RecallAt(at_all, kK, truth, kK, kK), recall_all);
}

TEST(IndexBuilder, RefusesFactoriesKnndCannotMap) {
  IndexBuilder::Options options;
  options.dim = kDim;
  for (const auto& [factory, reason] :
       std::vector<std::pair<std::string, std::string>>{
           {"IVF32,PQ8x4fs_64", "bbs=64"},
           {"IVF32,Flat", "IVF-PQ indexes only"},
           {"HNSW32", "not an inverted-file index"},
           {"IVF32,PQ8+16", "refinement"},
           {"IVF32,Bogus", "is not valid"}}) {
    options.factory = factory;
    auto builder = IndexBuilder::Create(options);
    ASSERT_FALSE(builder.ok()) << factory;
    EXPECT_EQ(builder.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(builder.status().message(), HasSubstr(reason)) << factory;
  }
  options.factory = "OPQ8,IVF32,PQ8";
  EXPECT_TRUE(IndexBuilder::Create(options).ok());
}

TEST(IndexBuilder, CosineNormalisesQueriesInTheDaemon) {
  TempDir dir;
  const std::string path = dir.path("cos.index");
  BuildIndex(path, Metric::kCosine);
  auto snapshot = IndexSnapshot::Load(path, {});
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ((*snapshot)->info().metric, Metric::kCosine);
  EXPECT_TRUE((*snapshot)->info().normalized);

  const std::vector<float> queries = MakeData(50, kDim, 5);
  std::vector<float> scaled = queries;
  for (float& v : scaled) v *= 7.5f;
  std::vector<float> d1, d2;
  const std::vector<int64_t> ids = Search(**snapshot, queries, 32, &d1);
  EXPECT_EQ(Search(**snapshot, scaled, 32, &d2), ids);
  for (size_t i = 0; i < d1.size(); ++i) {
    EXPECT_NEAR(d1[i], d2[i], 1e-4);
    EXPECT_LE(d1[i], 1.1f);  // cosines, not raw inner products
  }
  // FAISS itself, given queries normalised by hand, answers the same.
  std::vector<float> normalized = queries;
  for (int64_t q = 0; q < 50; ++q) {
    double norm = 0;
    for (int j = 0; j < kDim; ++j) norm += normalized[q * kDim + j] * normalized[q * kDim + j];
    for (int j = 0; j < kDim; ++j) normalized[q * kDim + j] /= std::sqrt(norm);
  }
  std::vector<float> ref_distances;
  std::vector<int64_t> ref_ids;
  ReferenceSearch(path, normalized, kK, 32, &ref_distances, &ref_ids);
  EXPECT_EQ(ids, ref_ids);
}

TEST(IndexMetadata, ChecksumMismatchIsRefused) {
  TempDir dir;
  const std::string path = dir.path("x.index");
  BuildIndex(path, Metric::kL2);
  ASSERT_TRUE(IndexSnapshot::Load(path, {}).ok());
  {
    // Flip one byte of the last stored code: structurally still valid.
    ::knnd::testing::FlipByteFromEnd(path, 40);
  }
  auto loaded = IndexSnapshot::Load(path, {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("CRC-32"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("x.index.meta.json"));
  LoadOptions unchecked;
  unchecked.verify_checksum = false;
  EXPECT_TRUE(IndexSnapshot::Load(path, unchecked).ok());
}

TEST(IndexMetadata, SidecarOfAnotherIndexIsRefused) {
  TempDir dir;
  BuildIndex(dir.path("a.index"), Metric::kL2);
  BuildIndex(dir.path("b.index"), Metric::kCosine);
  std::rename(MetadataPath(dir.path("b.index")).c_str(),
              MetadataPath(dir.path("a.index")).c_str());
  LoadOptions options;
  options.verify_checksum = false;  // reach the description check
  auto loaded = IndexSnapshot::Load(dir.path("a.index"), options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("does not describe"));
}

TEST(IndexMetadata, RoundTripsThroughJson) {
  TempDir dir;
  knnd::v1::IndexMetadata written;
  written.set_format_version(kIndexMetadataFormatVersion);
  written.set_dim(784);
  written.set_metric("cosine");
  written.set_normalized(true);
  written.set_ntotal(60000);
  written.set_crc32("0badf00d");
  ASSERT_TRUE(WriteIndexMetadata(dir.path("m.json"), written).ok());
  auto read = ReadIndexMetadata(dir.path("m.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), written.SerializeAsString());
  EXPECT_TRUE(absl::IsNotFound(ReadIndexMetadata(dir.path("none")).status()));
  written.set_format_version(kIndexMetadataFormatVersion + 1);
  ASSERT_TRUE(WriteIndexMetadata(dir.path("m.json"), written).ok());
  EXPECT_THAT(ReadIndexMetadata(dir.path("m.json")).status().message(),
              HasSubstr("format_version"));
}

}  // namespace
}  // namespace knnd
