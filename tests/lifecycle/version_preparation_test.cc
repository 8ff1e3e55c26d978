// VersionPreparation with the production defaults: warm-up queries on a
// worker of the pool before a version is published, and the canary check
// against the version serving when one is configured.
#include "knnd/lifecycle/version_preparation.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/storage/vector_io.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::kDim;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::TempDir;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

class VersionPreparationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Create(WorkerPool::Options());
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  // Version 1 of the test index, with ids from `first_id`.
  std::shared_ptr<const IndexSnapshot> Load(const std::string& name,
                                            int64_t first_id) {
    IndexSpec spec = VersionSpec(1);
    spec.first_id = first_id;
    WriteIndex(tmp_.path(name), spec);
    return LoadSnapshot(tmp_.path(name));
  }

  TempDir tmp_;
  std::unique_ptr<WorkerPool> pool_;
  IndexHolder holder_;
};

TEST_F(VersionPreparationTest, DefaultsWarmUpWithoutACanary) {
  std::shared_ptr<const IndexSnapshot> snapshot = Load("v.index", 0);
  ASSERT_NE(snapshot, nullptr);
  absl::StatusOr<std::unique_ptr<VersionPreparation>> preparation =
      VersionPreparation::Create(VersionPreparation::Options(), pool_.get(),
                                 &holder_);
  ASSERT_TRUE(preparation.ok()) << preparation.status();
  EXPECT_TRUE((*preparation)->Prepare(*snapshot).ok());
}

TEST_F(VersionPreparationTest, AnUnreadableCanarySetIsRefusedAtCreate) {
  VersionPreparation::Options options;
  options.canary_queries_path = tmp_.path("missing.fvecs");
  absl::StatusOr<std::unique_ptr<VersionPreparation>> preparation =
      VersionPreparation::Create(options, pool_.get(), &holder_);
  EXPECT_FALSE(preparation.ok());
  EXPECT_THAT(preparation.status().message(), HasSubstr("missing.fvecs"));
}

// With a canary and no ground truth the first version has nothing to be
// compared with and passes; a later one whose ids are all wrong is refused
// while the first serves.
TEST_F(VersionPreparationTest, CanaryRefusesAVersionThatLosesTheServingOne) {
  Matrix queries;
  queries.rows = 50;
  queries.dim = kDim;
  queries.values = MakeData(queries.rows, kDim, 99);
  VersionPreparation::Options options;
  options.canary_queries_path = tmp_.path("canary.fvecs");
  ASSERT_TRUE(WriteVectors(options.canary_queries_path, queries).ok());
  options.canary_min_recall = 0.3;
  absl::StatusOr<std::unique_ptr<VersionPreparation>> preparation =
      VersionPreparation::Create(options, pool_.get(), &holder_);
  ASSERT_TRUE(preparation.ok()) << preparation.status();

  std::shared_ptr<const IndexSnapshot> first = Load("first.index", 0);
  std::shared_ptr<const IndexSnapshot> wrong_ids = Load("wrong.index", 500000);
  ASSERT_TRUE(first && wrong_ids);
  EXPECT_TRUE((*preparation)->Prepare(*first).ok());
  holder_.Publish(first);
  absl::Status refused = (*preparation)->Prepare(*wrong_ids);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("canary recall@10 = 0.0000"));
}

}  // namespace
}  // namespace knnd
