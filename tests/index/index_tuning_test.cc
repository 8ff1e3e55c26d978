// TuneSearchDefaults picks the fastest setting that reaches the target
// recall; RecordTunedDefaults stores it in the sidecar, where IndexSnapshot
// finds it.
#include "knnd/index/index_tuning.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/storage/index_metadata.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::MakeData;
using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int64_t kRows = 4000;

// An IVF64,PQ8 index over MakeData(kRows, kDim, 7), with its sidecar.
Matrix BuildIndex(const std::string& path) {
  Matrix base;
  base.rows = kRows;
  base.dim = kDim;
  base.values = MakeData(kRows, kDim, 7);
  IndexBuilder::Options options;
  options.dim = kDim;
  options.factory = "IVF64,PQ8";
  auto builder = IndexBuilder::Create(options);
  EXPECT_TRUE(builder.ok()) << builder.status();
  EXPECT_TRUE((*builder)->Train(base.values.data(), kRows).ok());
  EXPECT_TRUE((*builder)->Add(base.values.data(), kRows, nullptr).ok());
  EXPECT_TRUE((*builder)->Write(path, 1, knnd::v1::IndexMetadata()).ok());
  return base;
}

std::unique_ptr<IndexSnapshot> Load(const std::string& path) {
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto snapshot = IndexSnapshot::Load(path, options);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return std::move(*snapshot);
}

TEST(IndexTuning, DefaultSweepsStepByHalfAPowerOfTwo) {
  EXPECT_EQ(DefaultNprobeSweep(256),
            (std::vector<int>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96,
                              128, 192, 256}));
  // nlist itself ends the sweep once, whatever it is.
  EXPECT_EQ(DefaultNprobeSweep(100),
            (std::vector<int>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96,
                              100}));
  EXPECT_EQ(DefaultNprobeSweep(6), (std::vector<int>{1, 2, 3, 4, 6}));
  EXPECT_EQ(DefaultNprobeSweep(1), (std::vector<int>{1}));
  EXPECT_EQ(DefaultRefineSweep(true),
            (std::vector<int>{0, 1, 2, 3, 4, 6, 8, 12, 16}));
  EXPECT_EQ(DefaultRefineSweep(false), (std::vector<int>{0}));
}

TEST(IndexTuning, ChoosesTheFastestSettingThatReachesTheTarget) {
  TempDir tmp;
  const std::string path = tmp.path("t.index");
  const Matrix base = BuildIndex(path);
  std::unique_ptr<IndexSnapshot> snapshot = Load(path);
  const Matrix queries = SampleRows(base, 200, 3);
  ASSERT_EQ(queries.rows, 200);
  auto truth = ExactNeighbors(base, queries, 10, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  TuneOptions options;
  options.target_recall = 0.5;
  auto result = TuneSearchDefaults(*snapshot, queries, *truth, 10, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->reached);
  EXPECT_GE(result->chosen.recall[0], 0.5);
  // Every other setting that reached the target measured no faster, and the
  // sweep stopped at the first nprobe that reached it.
  int reached = 0;
  for (const SweepRow& row : result->measured) {
    if (RecallBound(row, 0, options.confidence_z) >= 0.5) {
      ++reached;
      EXPECT_LE(row.queries_per_second, result->chosen.queries_per_second);
    }
  }
  EXPECT_EQ(reached, 1);  // one refine factor (no vectors), one crossing
  EXPECT_EQ(result->chosen.refine_factor, 0);

  // A target no setting reaches: the most accurate one, not reached.
  options.target_recall = 1.0;
  options.nprobes = {1, 2};
  result = TuneSearchDefaults(*snapshot, queries, *truth, 10, options);
  ASSERT_TRUE(result.ok());
  if (!result->reached) {
    for (const SweepRow& row : result->measured) {
      EXPECT_LE(row.recall[0], result->chosen.recall[0]);
    }
  }
  options.target_recall = 1.5;
  EXPECT_THAT(
      TuneSearchDefaults(*snapshot, queries, *truth, 10, options)
          .status()
          .message(),
      HasSubstr("target_recall=1.5 is outside (0, 1]"));
}

// LeaveOut drops each query's own id from its k + 1 results, or the last
// result when the id is not there; -1 padding is kept.
TEST(IndexTuning, LeaveOutDropsTheOwnIdOrTheLast) {
  const std::vector<int64_t> ids = {5, 7, 9, 11,   // own 7, second
                                    1, 2, 3, 4,    // own 8, absent
                                    6, 0, 0, 2,    // own 6, first
                                    3, -1, -1, -1};  // own -1: padding kept
  EXPECT_EQ(LeaveOut(ids, 3, std::vector<int64_t>{7, 8, 6, -1}),
            (std::vector<int64_t>{5, 9, 11, 1, 2, 3, 0, 0, 2, 3, -1, -1}));
}

// A sweep searches at its k, as a request of k neighbours does (re-ranking
// takes refine_factor * k candidates): recall columns wider than k are
// refused rather than measured at another k, and a grid names recall@k.
TEST(IndexTuning, SweepsSearchAtTheirKAndRefuseWiderColumns) {
  TempDir tmp;
  const std::string path = tmp.path("t.index");
  const Matrix base = BuildIndex(path);
  std::unique_ptr<IndexSnapshot> snapshot = Load(path);
  const Matrix queries = SampleRows(base, 50, 4);
  auto truth = ExactNeighbors(base, queries, 100, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  SweepOptions sweep;
  sweep.nprobes = {4};
  sweep.k = 10;
  sweep.recall_at = {1, 10};
  EXPECT_TRUE(SweepNprobe(*snapshot, queries, *truth, 100, sweep).ok());
  sweep.recall_at = {10, 100};
  EXPECT_THAT(
      SweepNprobe(*snapshot, queries, *truth, 100, sweep).status().message(),
      HasSubstr("recall@100 is outside [1, k=10]"));
  SettingsSweep grid;
  grid.k = 10;
  grid.nprobes = {4};
  grid.refine_factors = {0};
  grid.recall_at = {1};
  EXPECT_THAT(SweepSettings(MeasuredSnapshot(*snapshot), queries, *truth, 100,
                            grid)
                  .status()
                  .message(),
              HasSubstr("leave out recall@k (k=10)"));
}

// Without a setting reaching the target, the fastest within the tolerance
// of the best recall.
TEST(IndexTuning, ChoiceFallsBackToTheFastestNearTheBest) {
  auto row = [](double recall, double qps) {
    SweepRow r;
    r.recall = {recall};
    r.queries_per_second = qps;
    return r;
  };
  const std::vector<SweepRow> rows = {row(0.5, 100), row(0.9, 10),
                                      row(0.898, 50)};
  Choice near = ChooseSetting(rows, 0, 0.95, 0, 0.005);
  EXPECT_FALSE(near.reached);
  EXPECT_EQ(near.row, &rows[2]);
  EXPECT_EQ(ChooseSetting(rows, 0, 0.95, 0, 0).row, &rows[1]);
  Choice reached = ChooseSetting(rows, 0, 0.85, 0, 0);
  EXPECT_TRUE(reached.reached);
  EXPECT_EQ(reached.row, &rows[2]);
}

// Sampled rows as queries find themselves; left out of their results and
// of their truth they score lower (as a new query would), and the tuned
// setting then needs at least the nprobe that the self-inclusive measure
// needed.
TEST(IndexTuning, SampledQueriesLeaveThemselvesOut) {
  TempDir tmp;
  const std::string path = tmp.path("t.index");
  const Matrix base = BuildIndex(path);
  std::unique_ptr<IndexSnapshot> snapshot = Load(path);
  std::vector<int64_t> rows;
  const Matrix queries = SampleRows(base, 200, 3, &rows);
  ASSERT_EQ(rows.size(), 200u);
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(std::vector<float>(queries.row(i), queries.row(i) + kDim),
              std::vector<float>(base.row(rows[i]), base.row(rows[i]) + kDim));
  }
  auto with_self = ExactNeighbors(base, queries, 10, Metric::kL2);
  auto eleven = ExactNeighbors(base, queries, 11, Metric::kL2);
  ASSERT_TRUE(with_self.ok() && eleven.ok());
  const std::vector<int64_t> without_self = LeaveOut(*eleven, 10, rows);
  for (size_t q = 0; q < rows.size(); ++q) {
    for (int j = 0; j < 10; ++j) ASSERT_NE(without_self[q * 10 + j], rows[q]);
  }
  SweepOptions sweep;
  sweep.nprobes = {1};
  sweep.recall_at = {10};
  auto plain = SweepNprobe(*snapshot, queries, *with_self, 10, sweep);
  sweep.leave_out = rows;
  auto left_out = SweepNprobe(*snapshot, queries, without_self, 10, sweep);
  ASSERT_TRUE(plain.ok() && left_out.ok());
  EXPECT_LT(left_out->front().recall[0], plain->front().recall[0]);
  sweep.leave_out = absl::Span<const int64_t>(rows).subspan(1);
  EXPECT_THAT(SweepNprobe(*snapshot, queries, without_self, 10, sweep)
                  .status()
                  .message(),
              HasSubstr("leave_out has 199 ids for 200 queries"));

  TuneOptions options;
  options.target_recall = 0.6;
  auto inclusive = TuneSearchDefaults(*snapshot, queries, *with_self, 10,
                                      options);
  options.leave_out = rows;
  auto exclusive = TuneSearchDefaults(*snapshot, queries, without_self, 10,
                                      options);
  ASSERT_TRUE(inclusive.ok() && exclusive.ok());
  ASSERT_TRUE(inclusive->reached && exclusive->reached);
  EXPECT_GE(exclusive->chosen.nprobe, inclusive->chosen.nprobe);
}

// RecallAt's standard error is that of the mean of the per-query recalls.
TEST(IndexTuning, RecallAtGivesTheStandardErrorOfThePerQueryRecalls) {
  // Three queries, r = 2: recalls 1, 0.5 and 0.
  const std::vector<int64_t> truth = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> results = {2, 1, 3, 9, 7, 8};
  double se = -1;
  EXPECT_DOUBLE_EQ(RecallAt(results, 2, truth, 2, 2, &se), 0.5);
  // Sample standard deviation 0.5, over sqrt(3).
  EXPECT_NEAR(se, 0.5 / std::sqrt(3.0), 1e-12);
  EXPECT_DOUBLE_EQ(RecallAt(results, 2, truth, 2, 2, &se), 0.5);
  // One query: no spread to measure.
  EXPECT_DOUBLE_EQ(RecallAt(std::vector<int64_t>{1, 9},
                            2, std::vector<int64_t>{1, 2}, 2, 2, &se),
                   0.5);
  EXPECT_EQ(se, 0);
}

// A setting reaches the target when its recall less confidence_z standard
// errors does: the bound asks at least the nprobe the mean asks, and the
// chosen setting's bound reaches the target.
TEST(IndexTuning, TheTargetIsReachedByTheConfidenceBound) {
  TempDir tmp;
  const std::string path = tmp.path("t.index");
  const Matrix base = BuildIndex(path);
  std::unique_ptr<IndexSnapshot> snapshot = Load(path);
  const Matrix queries = SampleRows(base, 100, 5);
  auto truth = ExactNeighbors(base, queries, 10, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  TuneOptions options;
  options.target_recall = 0.45;
  options.confidence_z = 0;
  auto mean = TuneSearchDefaults(*snapshot, queries, *truth, 10, options);
  options.confidence_z = 3;
  auto bound = TuneSearchDefaults(*snapshot, queries, *truth, 10, options);
  ASSERT_TRUE(mean.ok() && bound.ok());
  ASSERT_TRUE(mean->reached && bound->reached);
  EXPECT_GT(bound->chosen.recall_se[0], 0);
  EXPECT_GE(RecallBound(bound->chosen, 0, 3), 0.45);
  EXPECT_GE(bound->chosen.nprobe, mean->chosen.nprobe);
  // The setting the mean chose falls short of the bound: a larger one.
  if (RecallBound(mean->chosen, 0, 3) < 0.45) {
    EXPECT_GT(bound->chosen.nprobe, mean->chosen.nprobe);
  }
  options.confidence_z = -1;
  EXPECT_THAT(TuneSearchDefaults(*snapshot, queries, *truth, 10, options)
                  .status()
                  .message(),
              HasSubstr("confidence_z=-1 is outside [0, 10]"));
}

TEST(IndexTuning, RecordedDefaultsReachTheSnapshot) {
  TempDir tmp;
  const std::string path = tmp.path("t.index");
  BuildIndex(path);
  TuneResult result;
  result.reached = true;
  result.chosen.nprobe = 7;
  result.chosen.refine_factor = 2;
  result.chosen.recall = {0.97};
  result.chosen.queries_per_second = 1234;
  TuneOptions options;
  options.target_recall = 0.95;
  ASSERT_TRUE(RecordTunedDefaults(path, options, result, "a sample").ok());
  auto meta = ReadIndexMetadata(MetadataPath(path));
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->tuned_on(), "a sample");
  EXPECT_DOUBLE_EQ(meta->tuned_queries_per_second(), 1234);
  // The sidecar still matches the file (its checksum was kept).
  std::unique_ptr<IndexSnapshot> snapshot = Load(path);
  EXPECT_EQ(snapshot->info().tuned_nprobe, 7);
  EXPECT_EQ(snapshot->info().tuned_refine_factor, 2);
  EXPECT_EQ(snapshot->info().tuned_k, 10);
  EXPECT_DOUBLE_EQ(snapshot->info().target_recall, 0.95);
  EXPECT_DOUBLE_EQ(snapshot->info().tuned_recall, 0.97);

  const absl::Status no_sidecar =
      RecordTunedDefaults(tmp.path("none.index"), options, result, "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(no_sidecar)) << no_sidecar;
  EXPECT_THAT(no_sidecar.message(), HasSubstr("has no sidecar"));
}

}  // namespace
}  // namespace knnd
