// IndexBuilder: defaults from the data's shape, the factories it refuses,
// and built files that load and search as FAISS's own, for L2 and cosine.
#include "knnd/index/index_builder.h"

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BruteForceNeighbors;
using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::NormalizedRows;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::SearchResults;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int64_t kRows = 4000;
constexpr int kK = 10;

// An index of knnd's builder over MakeData(kRows, kDim, 7), IVF32,PQ8.
BuildSpec Spec(Metric metric) {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.seed = 7;
  spec.metric = metric;
  spec.factory = "IVF32,PQ8";
  return spec;
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
  EXPECT_EQ(DefaultPqM(784), 49);  // 16 wide: 56 would be 14 wide (slow)
  EXPECT_EQ(DefaultPqM(384), 48);  // 8 wide: 64 would be 6 wide (slow)
  EXPECT_EQ(DefaultPqM(128), 32);
  EXPECT_EQ(DefaultPqM(768), 64);
  EXPECT_EQ(DefaultPqM(3), 1);
  // The default (FastScan) recipe: nlist near sqrt(N), sub-vectors at most
  // 4 dims wide (4, then 2, then 3) and at least kMinFastScanM (96) of them.
  EXPECT_EQ(DefaultFastScanNlist(60000), 256);  // sqrt(60000) = 245
  EXPECT_EQ(DefaultFastScanNlist(1000000), 1024);
  EXPECT_EQ(DefaultFastScanNlist(4000), 64);
  EXPECT_EQ(DefaultFastScanNlist(1000), 16);  // sqrt = 32, but 1000/39 = 25
  EXPECT_EQ(DefaultFastScanNlist(10), 1);
  EXPECT_EQ(DefaultFastScanM(784), 196);   // 4 wide
  EXPECT_EQ(DefaultFastScanM(768), 192);   // 4 wide
  EXPECT_EQ(DefaultFastScanM(384), 96);    // 4 wide: exactly 96
  EXPECT_EQ(DefaultFastScanM(810), 405);   // 2 wide: 4 does not divide
  EXPECT_EQ(DefaultFastScanM(999), 333);   // 3 wide: odd
  EXPECT_EQ(DefaultFastScanM(300), 150);   // 2 wide: 4 would leave 75
  EXPECT_EQ(DefaultFastScanM(256), 128);   // 2 wide: 4 would leave 64
  EXPECT_EQ(DefaultFastScanM(192), 96);    // 2 wide
  EXPECT_EQ(DefaultFastScanM(128), 128);   // 1 wide: 2 would leave 64
  EXPECT_EQ(DefaultFastScanM(100), 100);   // 1 wide
  EXPECT_EQ(DefaultFastScanM(16), 16);
  EXPECT_EQ(DefaultFastScanM(251), 251);   // prime
  EXPECT_EQ(DefaultTrainRows(60000, 1024), 60000);
  EXPECT_EQ(DefaultTrainRows(10000000, 4096), 204800);
  EXPECT_EQ(DefaultNprobe(1024), 32);
}

TEST(IndexBuilder, BuiltFileLoadsAndSearchesLikeFaissWithSaneRecall) {
  TempDir dir;
  const std::string path = dir.path("x.index");
  const std::vector<float> base = BuildIndex(path, Spec(Metric::kL2));
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
  const std::vector<int64_t> truth =
      BruteForceNeighbors(base, queries, kDim, kK, Metric::kL2);
  const std::vector<int64_t> at1 =
      SearchSnapshot(**snapshot, queries, kK, 1).ids;
  const std::vector<int64_t> at_all =
      SearchSnapshot(**snapshot, queries, kK, 32).ids;
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
  BuildIndex(path, Spec(Metric::kCosine));
  auto snapshot = IndexSnapshot::Load(path, {});
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ((*snapshot)->info().metric, Metric::kCosine);
  EXPECT_TRUE((*snapshot)->info().normalized);

  const std::vector<float> queries = MakeData(50, kDim, 5);
  std::vector<float> scaled = queries;
  for (float& v : scaled) v *= 7.5f;
  const SearchResults plain = SearchSnapshot(**snapshot, queries, kK, 32);
  const SearchResults larger = SearchSnapshot(**snapshot, scaled, kK, 32);
  const std::vector<float>& d1 = plain.distances;
  const std::vector<float>& d2 = larger.distances;
  const std::vector<int64_t>& ids = plain.ids;
  EXPECT_EQ(larger.ids, ids);
  for (size_t i = 0; i < d1.size(); ++i) {
    EXPECT_NEAR(d1[i], d2[i], 1e-4);
    EXPECT_LE(d1[i], 1.1f);  // cosines, not raw inner products
  }
  // FAISS itself, given queries normalised by hand, answers the same.
  const std::vector<float> normalized = NormalizedRows(queries, kDim);
  std::vector<float> ref_distances;
  std::vector<int64_t> ref_ids;
  ReferenceSearch(path, normalized, kK, 32, &ref_distances, &ref_ids);
  EXPECT_EQ(ids, ref_ids);
}

}  // namespace
}  // namespace knnd
