// The drift report's trained reference: recorded at build, carried
// unchanged through chains of updates with the rows changed since
// training counted on, the retrain rule on those counts and on the
// trained-relative ratios, and the fallback to the base for a sidecar
// without a reference.
#include "knnd/index/update_drift.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_update.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteVectorsFile;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int64_t kRows = 3000;

std::vector<float> RowRange(const std::vector<float>& x, int64_t first,
                            int64_t end) {
  return std::vector<float>(x.begin() + first * kDim, x.begin() + end * kDim);
}

// Rows [0, rows) of `x` built at `path` as knnctl build builds them
// (FastScan recipe, INDEX.vectors), the trained reference measured by a
// TrainedReferenceSample fed the batches and written in the sidecar.
void BuildWithReference(const std::string& path, const std::vector<float>& x,
                        int64_t rows) {
  SetOpenMpThreadsOfThisThread(1);
  IndexBuilder::Options options;
  options.dim = kDim;
  options.factory = "IVF16,PQ16x4fs";
  absl::StatusOr<std::unique_ptr<IndexBuilder>> builder =
      IndexBuilder::Create(options);
  ASSERT_TRUE(builder.ok()) << builder.status();
  ASSERT_TRUE((*builder)->Train(x.data(), rows).ok());
  TrainedReferenceSample reference(rows, kDim);
  for (int64_t begin = 0; begin < rows; begin += 1000) {
    const int64_t n = std::min<int64_t>(1000, rows - begin);
    ASSERT_TRUE((*builder)->Add(x.data() + begin * kDim, n, nullptr).ok());
    reference.Collect(begin, n, x.data() + begin * kDim);
  }
  ASSERT_TRUE(WriteVectorsFile(VectorsPath(path), RowRange(x, 0, rows), kDim,
                               VectorsDtype::kFloat32)
                  .ok());
  absl::StatusOr<knnd::v1::IndexMetadata::TrainedReference> trained =
      reference.Measure(**builder);
  ASSERT_TRUE(trained.ok()) << trained.status();
  knnd::v1::IndexMetadata metadata;
  *metadata.mutable_trained() = *trained;
  ASSERT_TRUE((*builder)->Write(path, 4, metadata).ok());
}

// kRows seeded rows built as before the sidecar recorded a trained
// reference (the test builder writes none), with INDEX.vectors of `dtype`.
void BuildWithoutReference(const std::string& path, VectorsDtype dtype) {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.factory = "IVF16,PQ16x4fs";
  spec.vectors = dtype;
  BuildIndex(path, spec);
}

// Updates `base` into `output`: `additions` appended (row ids), the ids
// `deletions` removed, recall estimated on `recall_queries` rows.
UpdateReport Update(const std::string& base, const std::string& output,
                    const std::vector<float>& additions,
                    const std::vector<int64_t>& deletions,
                    int recall_queries = 0) {
  UpdateOptions options;
  options.base_path = base;
  options.output_path = output;
  options.input_name = "delta";
  Matrix input;
  input.dim = kDim;
  input.rows = static_cast<int64_t>(additions.size()) / kDim;
  input.values = additions;
  if (input.rows > 0) options.input = &input;
  options.deletions = deletions;
  options.recall_queries = recall_queries;
  options.built_by = "update_drift_test";
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : UpdateReport{};
}

knnd::v1::IndexMetadata Sidecar(const std::string& index) {
  absl::StatusOr<knnd::v1::IndexMetadata> read =
      ReadIndexMetadata(MetadataPath(index));
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? *read : knnd::v1::IndexMetadata{};
}

bool MentionsSinceTraining(const UpdateDrift& drift) {
  for (const std::string& why : drift.retrain_reasons) {
    if (why.find("since training") != std::string::npos) return true;
  }
  return false;
}

TEST(UpdateDrift, BuildRecordsTheReferenceAndUpdatesCarryItUnchanged) {
  TempDir dir;
  const std::vector<float> x = MakeData(kRows + 400, kDim, 7);
  const std::string v1 = dir.path("v1.index");
  BuildWithReference(v1, x, kRows);
  const knnd::v1::IndexMetadata built = Sidecar(v1);
  ASSERT_TRUE(built.has_trained());
  const auto& trained = built.trained();
  EXPECT_GT(trained.coarse_error(), 0);
  EXPECT_GT(trained.pq_error(), 0);
  EXPECT_EQ(trained.sample_rows(), kRows);  // fewer rows than the sample
  EXPECT_EQ(trained.ntotal(), kRows);
  EXPECT_GE(trained.list_imbalance(), 1.0);
  EXPECT_EQ(built.rows_added_since_training(), 0);

  // The first update samples the base as the build sampled its rows.
  const UpdateReport first =
      Update(v1, dir.path("v2.index"), RowRange(x, kRows, kRows + 200), {3, 9});
  ASSERT_TRUE(first.drift.has_trained);
  EXPECT_NEAR(first.drift.base_coarse_error, trained.coarse_error(),
              1e-5 * trained.coarse_error());
  EXPECT_NEAR(first.drift.base_pq_error, trained.pq_error(),
              1e-5 * trained.pq_error());
  EXPECT_NEAR(first.drift.base_imbalance, trained.list_imbalance(), 1e-9);
  EXPECT_EQ(first.drift.rows_added_since_training, 200);
  EXPECT_EQ(first.drift.rows_deleted_since_training, 2);
  const knnd::v1::IndexMetadata v2 = Sidecar(dir.path("v2.index"));
  ASSERT_TRUE(v2.has_trained());
  EXPECT_EQ(v2.trained().SerializeAsString(), trained.SerializeAsString());
  EXPECT_EQ(v2.rows_added_since_training(), 200);
  EXPECT_EQ(v2.rows_deleted_since_training(), 2);
  EXPECT_THAT(DescribeDrift(first.drift),
              ::testing::Contains(HasSubstr("PQ error (trained -> delta)")));

  // v2 has its own ids now (a deletion renumbered its rows): the next
  // update names them. Its counts go on from v2's.
  UpdateOptions options;
  options.base_path = dir.path("v2.index");
  options.output_path = dir.path("v3.index");
  options.input_name = "delta";
  Matrix input;
  input.dim = kDim;
  input.rows = 200;
  input.values = RowRange(x, kRows + 200, kRows + 400);
  options.input = &input;
  for (int64_t i = 0; i < 200; ++i) options.input_ids.push_back(50000 + i);
  options.input_ids[0] = 10;  // an upsert: counted as added, not deleted
  options.deletions = {11};
  options.recall_queries = 0;
  absl::StatusOr<UpdateReport> second = UpdateIndexFile(options);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->plan.upserted, 1);
  const knnd::v1::IndexMetadata v3 = Sidecar(dir.path("v3.index"));
  EXPECT_EQ(v3.trained().SerializeAsString(), trained.SerializeAsString());
  EXPECT_EQ(v3.rows_added_since_training(), 400);
  EXPECT_EQ(v3.rows_deleted_since_training(), 3);
}

// Additions of the data the base was trained on move no figure, yet once
// the rows added since training pass a third of the trained ntotal a
// retrain is due, though each update alone is small.
TEST(UpdateDrift, ChainedAdditionsPastAThirdOfTheTrainedRowsMakeARetrainDue) {
  TempDir dir;
  const std::vector<float> x = MakeData(kRows * 2, kDim, 7);
  std::string base = dir.path("v0.index");
  BuildWithReference(base, x, kRows);
  const int64_t step = kRows / 10;
  for (int i = 1; i <= 4; ++i) {
    const std::string next = dir.path(absl::StrCat("v", i, ".index"));
    const int64_t first = kRows + (i - 1) * step;
    const UpdateReport report =
        Update(base, next, RowRange(x, first, first + step), {});
    ASSERT_TRUE(report.drift.has_trained);
    EXPECT_EQ(report.drift.rows_added_since_training, i * step);
    // 10%, 20%, 30%: not yet; 40%: past a third.
    EXPECT_EQ(MentionsSinceTraining(report.drift), i == 4) << "update " << i;
    base = next;
  }
}

TEST(UpdateDrift, DeletionsPastAThirdOfTheTrainedRowsMakeARetrainDue) {
  TempDir dir;
  const std::vector<float> x = MakeData(kRows, kDim, 7);
  BuildWithReference(dir.path("v1.index"), x, kRows);
  std::vector<int64_t> deletions;
  for (int64_t id = 0; id < kRows / 3 + 10; ++id) deletions.push_back(id);
  const UpdateReport report =
      Update(dir.path("v1.index"), dir.path("v2.index"), {}, deletions);
  EXPECT_EQ(report.drift.rows_deleted_since_training, kRows / 3 + 10);
  EXPECT_TRUE(MentionsSinceTraining(report.drift));
}

// An index built before the sidecar recorded a reference: the base is the
// only comparison, nothing is counted, and the report says so.
TEST(UpdateDrift, ASidecarWithoutTheReferenceFallsBackToTheBase) {
  TempDir dir;
  BuildWithoutReference(dir.path("v1.index"), VectorsDtype::kFloat32);
  ASSERT_FALSE(Sidecar(dir.path("v1.index")).has_trained());
  std::vector<int64_t> deletions;
  for (int64_t id = 0; id < kRows / 2; ++id) deletions.push_back(id);
  const UpdateReport report = Update(dir.path("v1.index"), dir.path("v2.index"),
                                     MakeData(100, kDim, 8), deletions);
  EXPECT_FALSE(report.drift.has_trained);
  EXPECT_FALSE(MentionsSinceTraining(report.drift));
  EXPECT_GT(report.drift.base_pq_error, 0);
  const knnd::v1::IndexMetadata v2 = Sidecar(dir.path("v2.index"));
  EXPECT_FALSE(v2.has_trained());
  EXPECT_EQ(v2.rows_added_since_training(), 0);
  EXPECT_EQ(v2.rows_deleted_since_training(), 0);
  EXPECT_THAT(DescribeDrift(report.drift),
              ::testing::Contains(HasSubstr("no trained reference")));
}

// The recall estimate's exact search over a float16 INDEX.vectors (decoded
// block by block): at every list probed and with exact re-ranking over
// the same vectors, the index finds nearly all of the true neighbours;
// a wrong ground truth would find few.
TEST(UpdateDrift, RecallEstimateOverFloat16Vectors) {
  TempDir dir;
  BuildWithoutReference(dir.path("v1.index"), VectorsDtype::kFloat16);
  knnd::v1::IndexMetadata tuned = Sidecar(dir.path("v1.index"));
  tuned.set_tuned_nprobe(16);
  tuned.set_tuned_refine_factor(32);
  ASSERT_TRUE(RewriteSidecar(dir.path("v1.index"), tuned, "test").ok());
  const UpdateReport report = Update(dir.path("v1.index"), dir.path("v2.index"),
                                     MakeData(100, kDim, 9), {}, 40);
  EXPECT_EQ(report.drift.recall_queries, 40);
  EXPECT_EQ(report.drift.recall_nprobe, 16);
  EXPECT_GT(report.drift.recall, 0.8);
  EXPECT_LE(report.drift.recall, 1.0);
}

// The trained-relative ratios judged like the base-relative ones.
TEST(UpdateDrift, TrainedRatiosPastTheLimitsMakeARetrainDue) {
  UpdateDrift drift;
  drift.base_coarse_error = 100;
  drift.base_pq_error = 50;
  drift.new_coarse_error = 110;  // 1.1x the base's: within
  drift.new_pq_error = 52;
  drift.base_imbalance = 1.5;
  drift.new_imbalance = 1.6;
  drift.has_trained = true;
  drift.trained.set_coarse_error(85);  // 1.29x: over 1.2x
  drift.trained.set_pq_error(50);
  drift.trained.set_list_imbalance(1.0);  // 1.6x: over 1.5x
  drift.trained.set_ntotal(1000);
  drift.rows_added_since_training = 100;
  JudgeRetrain(drift);
  ASSERT_EQ(drift.retrain_reasons.size(), 2u);
  EXPECT_THAT(drift.retrain_reasons[0],
              HasSubstr("coarse quantization error is 1.29x the trained"));
  EXPECT_THAT(drift.retrain_reasons[1], HasSubstr("1.60x the trained"));

  // Without the reference the same figures are within the base's limits.
  drift.has_trained = false;
  drift.retrain_reasons.clear();
  JudgeRetrain(drift);
  EXPECT_TRUE(drift.retrain_reasons.empty());
}

}  // namespace
}  // namespace knnd
