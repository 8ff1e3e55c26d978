// Exact re-ranking (index/rerank.h) as IndexSnapshot::Search runs it:
// re-ranked results against exact search for each metric and for float16
// vectors, and the whole path over gRPC.
#include "knnd/index/rerank.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vectors_file.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::CallSearch;
using ::knnd::testing::FindSample;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::MakeSearchRequest;
using ::knnd::testing::NormalizedRows;
using ::knnd::testing::ReadFile;
using ::knnd::testing::ReferenceDistance;
using ::knnd::testing::RunningServer;
using ::knnd::testing::Scrape;
using ::knnd::testing::SearchResults;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteVectorsFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kRows = 2000;
constexpr int kDim = 16;
constexpr int kNlist = 16;
constexpr int kK = 10;

// A coarse IVF-PQ index over MakeData(kRows, kDim, 5) (PQ4: 4 bytes per
// vector, so PQ alone ranks poorly) and, unless `dtype` is unset, its raw
// vectors beside it. Returns the base as given.
std::vector<float> BuildWithVectors(const std::string& path, Metric metric,
                                    absl::optional<VectorsDtype> dtype) {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.seed = 5;
  spec.metric = metric;
  spec.factory = absl::StrCat("IVF", kNlist, ",PQ4");
  spec.vectors = dtype;
  return BuildIndex(path, spec);
}

LoadOptions WithVectors(VectorsPolicy policy) {
  LoadOptions options;
  options.vectors = policy;
  return options;
}

class RerankMetricTest : public ::testing::TestWithParam<Metric> {};

// With every list probed and refine_factor * k >= ntotal, every vector is a
// candidate, so the re-ranked ids must be exactly those of a flat
// (brute-force) search, with exact distances; PQ alone gets fewer right.
TEST_P(RerankMetricTest, CoveringRefineEqualsExactSearch) {
  const Metric metric = GetParam();
  TempDir tmp;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), metric, VectorsDtype::kFloat32);
  auto snapshot =
      LoadSnapshot(tmp.path("x.index"), WithVectors(VectorsPolicy::kRequired));
  ASSERT_NE(snapshot, nullptr);
  EXPECT_TRUE(snapshot->info().has_vectors);
  EXPECT_EQ(snapshot->info().vectors_dtype, "f32");
  const std::vector<float> q = MakeData(50, kDim, 77);
  const Matrix queries{50, kDim, q};
  const Matrix base_matrix{kRows, kDim, base};
  auto truth = ExactNeighbors(base_matrix, queries, kK, metric);
  ASSERT_TRUE(truth.ok()) << truth.status();

  const SearchResults refined =
      SearchSnapshot(*snapshot, q, kK, kNlist, kRows / kK);
  const std::vector<int64_t>& ids = refined.ids;
  EXPECT_EQ(ids, *truth);
  const std::vector<float> stored =
      metric == Metric::kCosine ? NormalizedRows(base, kDim) : base;
  for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) {
    const double want =
        ReferenceDistance(metric, q.data() + (i / kK) * kDim,
                          stored.data() + ids[i] * kDim, kDim);
    EXPECT_NEAR(refined.distances[i], want, 1e-3 * (1 + std::abs(want))) << i;
  }
  const std::vector<int64_t> pq = SearchSnapshot(*snapshot, q, kK, kNlist).ids;
  EXPECT_LT(RecallAt(pq, kK, *truth, kK, kK), 0.95);
  EXPECT_EQ(RecallAt(ids, kK, *truth, kK, kK), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Metrics, RerankMetricTest,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct,
                                           Metric::kCosine),
                         [](const auto& info) {
                           return std::string(MetricName(info.param));
                         });

// float16 vectors: half the file, ids still those of exact search but for
// near-ties that the rounding may swap, and each answer's distance the
// exact one to its vector as stored (rounded to float16), bit for bit.
TEST(Rerank, Float16FileHalvesTheBytesAndKeepsRecall) {
  TempDir tmp;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), Metric::kL2,
                       VectorsDtype::kFloat16);
  auto snapshot =
      LoadSnapshot(tmp.path("x.index"), WithVectors(VectorsPolicy::kRequired));
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(snapshot->info().vectors_dtype, "f16");
  EXPECT_EQ(snapshot->info().vectors_file_bytes,
            kVectorsHeaderBytes + int64_t{kRows} * kDim * 2);
  const std::vector<float> q = MakeData(50, kDim, 78);
  auto truth = ExactNeighbors(Matrix{kRows, kDim, base}, Matrix{50, kDim, q},
                              kK, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  const SearchResults refined =
      SearchSnapshot(*snapshot, q, kK, kNlist, kRows / kK);
  EXPECT_GE(RecallAt(refined.ids, kK, *truth, kK, kK), 0.99);
  std::vector<float> stored(kDim);
  for (size_t i = 0; i < refined.ids.size(); ++i) {
    const int64_t id = refined.ids[i];
    ASSERT_GE(id, 0) << i;
    for (int j = 0; j < kDim; ++j) {
      stored[j] = HalfToFloat(FloatToHalf(base[id * kDim + j]));
    }
    EXPECT_EQ(refined.distances[i],
              L2Squared(q.data() + (i / kK) * kDim, stored.data(), kDim))
        << "answer " << i << " (id " << id << ")";
  }
}

// Over gRPC: the response says which refine_factor answered, re-ranked
// results are exact, the re-rank histogram and the vectors residency are
// exported, and GetIndexInfo reports the vectors.
TEST(RerankServer, ResponseReportsRefineFactorAndResultsAreExact) {
  TempDir tmp;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), Metric::kL2,
                       VectorsDtype::kFloat32);
  knnd::v1::ServerConfig config = TestConfig(tmp.path("x.index"));
  config.set_default_refine_factor(2);
  config.set_max_refine_factor(kRows / kK);
  config.set_require_vectors(true);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);

  const std::vector<float> q = MakeData(20, kDim, 79);
  auto truth = ExactNeighbors(Matrix{kRows, kDim, base}, Matrix{20, kDim, q},
                              kK, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  knnd::v1::SearchRequest request = MakeSearchRequest(q, kK);
  request.set_nprobe(kNlist);
  {
    knnd::v1::SearchResponse response;
    ASSERT_TRUE(CallSearch(*s.stub, request, &response).ok());
    EXPECT_EQ(response.refine_factor(), 2u);  // the config's default
  }
  request.set_refine_factor(kRows / kK);
  knnd::v1::SearchResponse response;
  grpc::Status status = CallSearch(*s.stub, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.refine_factor(), static_cast<uint32_t>(kRows / kK));
  EXPECT_EQ(std::vector<int64_t>(response.ids().begin(), response.ids().end()),
            *truth);

  request.set_refine_factor(kRows / kK + 1);
  status = CallSearch(*s.stub, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("max_refine_factor"));

  grpc::ClientContext info_context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(s.stub->GetIndexInfo(&info_context, {}, &info).ok());
  EXPECT_TRUE(info.has_vectors());
  EXPECT_EQ(info.vectors_dtype(), "f32");
  EXPECT_EQ(info.default_refine_factor(), 2u);
  EXPECT_EQ(info.max_refine_factor(), static_cast<uint32_t>(kRows / kK));

  const auto samples = Scrape(s.server->metrics_port());
  // Warm-up, the default and the covering request re-ranked.
  EXPECT_GE(FindSample(samples, "knnd_search_rerank_duration_seconds_count")
                .value_or(0),
            2);
  // Whole pages of the mapping.
  const double file_bytes = kVectorsHeaderBytes + int64_t{kRows} * kDim * 4;
  const double mapped =
      FindSample(samples, "knnd_vectors_mapped_bytes").value_or(0);
  EXPECT_GE(mapped, file_bytes);
  EXPECT_LT(mapped, file_bytes + 4096);
  EXPECT_TRUE(
      FindSample(samples, "knnd_vectors_page_cache_resident_bytes").has_value());
}

// A server whose vectors file does not match still serves plain searches,
// refuses re-ranked ones with FAILED_PRECONDITION, and uses refine 0 by
// default even though the config asks for more.
TEST(RerankServer, BadVectorsFileServesTheIndexAlone) {
  TempDir tmp;
  // The version's vectors file replaced by another build's (17 dims).
  BuildWithVectors(tmp.path("x.index"), Metric::kL2, VectorsDtype::kFloat32);
  ASSERT_TRUE(WriteVectorsFile(VectorsPath(tmp.path("x.index")),
                               MakeData(kRows, kDim + 1, 3), kDim + 1,
                               VectorsDtype::kFloat32)
                  .ok());
  knnd::v1::ServerConfig config = TestConfig(tmp.path("x.index"));
  config.set_default_refine_factor(4);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  const std::vector<float> q = MakeData(2, kDim, 80);
  knnd::v1::SearchRequest request = MakeSearchRequest(q, kK);
  {
    knnd::v1::SearchResponse response;
    grpc::Status status = CallSearch(*s.stub, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.refine_factor(), 0u);
    EXPECT_EQ(response.ids_size(), 2 * kK);
  }
  request.set_refine_factor(4);
  grpc::Status status = CallSearch(*s.stub, request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("refine_factor=4"), HasSubstr("dim=17"),
                    HasSubstr("index has dim=16")));
  // Another build's file of the right shape is not used either: the
  // manifest binds the version's own.
  BuildWithVectors(tmp.path("y.index"), Metric::kL2, VectorsDtype::kFloat32);
  const std::string theirs = ReadFile(VectorsPath(tmp.path("y.index")));
  BuildWithVectors(tmp.path("z.index"), Metric::kL2, VectorsDtype::kFloat16);
  WriteFile(VectorsPath(tmp.path("z.index")), theirs);
  LoadOptions optional = WithVectors(VectorsPolicy::kOptional);
  auto served = LoadSnapshot(tmp.path("z.index"), optional);
  ASSERT_NE(served, nullptr);
  EXPECT_FALSE(served->info().has_vectors);
  EXPECT_THAT(served->info().vectors_error,
              AllOf(HasSubstr("z.index.vectors"), HasSubstr("another build")));
}

// Equal estimates are decided by id, missing candidates go last, and the
// direction follows the metric: the rule that makes shards' candidates the
// unsharded index's.
TEST(KeepBestCandidates, TakesTheBestEstimatesTiesByIdMissingLast) {
  const int64_t ids[] = {9, 4, -1, 7, 2, 5};
  const float est[] = {1.0f, 2.0f, 0.0f, 1.0f, 2.0f, 3.0f};
  int64_t out_ids[4];
  float out_est[4];
  KeepBestCandidates(Metric::kL2, ids, est, 1, 6, 4, out_ids, out_est);
  EXPECT_THAT(out_ids, ::testing::ElementsAre(7, 9, 2, 4));
  EXPECT_THAT(out_est, ::testing::ElementsAre(1.0f, 1.0f, 2.0f, 2.0f));
  KeepBestCandidates(Metric::kInnerProduct, ids, est, 1, 6, 4, out_ids,
                     out_est);
  EXPECT_THAT(out_ids, ::testing::ElementsAre(5, 2, 4, 7));
  // Two queries, three of three kept: the missing one last.
  const int64_t two_ids[] = {3, -1, 1, -1, 8, 6};
  const float two_est[] = {5.0f, 0.0f, 5.0f, 0.0f, 1.0f, 1.0f};
  int64_t two_out[6];
  float two_out_est[6];
  KeepBestCandidates(Metric::kL2, two_ids, two_est, 2, 3, 3, two_out,
                     two_out_est);
  EXPECT_THAT(two_out, ::testing::ElementsAre(1, 3, -1, 6, 8, -1));
}

// Estimates in an index's order (closest first, missing ones last, many
// ties) and in no order: both give the order of (missing last, estimate,
// id), the kc first of every candidate.
TEST(KeepBestCandidates, AnyInputOrderGivesTheSameChoice) {
  std::mt19937_64 rng(11);
  for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
    const bool ascending = SmallerIsCloser(metric);
    for (int trial = 0; trial < 300; ++trial) {
      const int kf = 1 + static_cast<int>(rng() % 40);
      const int kc = 1 + static_cast<int>(rng() % kf);
      const int missing = static_cast<int>(rng() % 3 == 0 ? rng() % kf : 0);
      std::vector<std::pair<float, int64_t>> c(kf);
      for (int j = 0; j < kf; ++j) {
        c[j] = {static_cast<float>(rng() % 6),
                j < kf - missing ? static_cast<int64_t>(rng() % 1000) : -1};
      }
      auto closer = [&](const std::pair<float, int64_t>& a,
                        const std::pair<float, int64_t>& b) {
        if ((a.second < 0) != (b.second < 0)) return b.second < 0;
        if (a.first != b.first) {
          return ascending ? a.first < b.first : a.first > b.first;
        }
        return a.second < b.second;
      };
      std::vector<std::pair<float, int64_t>> want = c;
      std::sort(want.begin(), want.end(), closer);
      // An index's order: by estimate alone, ties in any order.
      std::vector<std::pair<float, int64_t>> indexed = c;
      std::shuffle(indexed.begin(), indexed.end(), rng);
      std::stable_sort(indexed.begin(), indexed.end(),
                       [&](const auto& a, const auto& b) {
                         if ((a.second < 0) != (b.second < 0)) {
                           return b.second < 0;
                         }
                         return a.second >= 0 && (ascending ? a.first < b.first
                                                            : a.first > b.first);
                       });
      for (const auto* input : {&c, &indexed}) {
        std::vector<int64_t> ids(kf), out_ids(kc);
        std::vector<float> est(kf), out_est(kc);
        for (int j = 0; j < kf; ++j) {
          est[j] = (*input)[j].first;
          ids[j] = (*input)[j].second;
        }
        KeepBestCandidates(metric, ids.data(), est.data(), 1, kf, kc,
                           out_ids.data(), out_est.data());
        for (int j = 0; j < kc; ++j) {
          ASSERT_EQ(out_ids[j], want[j].second) << trial << " at " << j;
          if (want[j].second >= 0) {
            ASSERT_EQ(out_est[j], want[j].first) << trial << " at " << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace knnd
