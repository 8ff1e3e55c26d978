// RetainedVersions: which replaced versions stay loaded for a rollback,
// most recent first and at most the capacity, and whose checksum states
// are remembered.
#include "knnd/lifecycle/retained_versions.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::ElementsAre;

using State = Metrics::ChecksumState;

// Versions 1 to 4, loaded from one small index file.
class RetainedVersionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tmp_.path("v.index");
    WriteIndex(path_, VersionSpec(1));
    for (int64_t v = 1; v <= 4; ++v) {
      LoadOptions options;
      options.version = v;
      std::shared_ptr<const IndexSnapshot> snapshot =
          LoadSnapshot(path_, options);
      ASSERT_NE(snapshot, nullptr);
      versions_[v] = snapshot;
    }
  }

  std::shared_ptr<const IndexSnapshot> V(int64_t v) { return versions_[v]; }

  // The retained version numbers, most recent first.
  static std::vector<int64_t> Numbers(const RetainedVersions& retained) {
    std::vector<int64_t> numbers;
    for (const IndexVersion& v : retained.Versions()) {
      numbers.push_back(v.version);
    }
    return numbers;
  }

  TempDir tmp_;
  std::string path_;
  std::map<int64_t, std::shared_ptr<const IndexSnapshot>> versions_;
};

TEST_F(RetainedVersionsTest, KeepsTheMostRecentUpToItsCapacity) {
  RetainedVersions retained(2);
  retained.Replaced(nullptr, *V(1));  // the first version served
  EXPECT_THAT(Numbers(retained), ElementsAre());
  retained.Replaced(V(1), *V(2));
  retained.Replaced(V(2), *V(3));
  EXPECT_THAT(Numbers(retained), ElementsAre(2, 1));
  retained.Replaced(V(3), *V(4));
  EXPECT_THAT(Numbers(retained), ElementsAre(3, 2)) << "1 was let go";
  EXPECT_EQ(retained.Find({3, path_}), V(3));
  EXPECT_EQ(retained.Find({1, path_}), nullptr);
  EXPECT_EQ(retained.Find({3, path_ + ".other"}), nullptr)
      << "another file under the same number";
}

// A rollback republishes a retained version: it is no longer retained, and
// the version it replaces is.
TEST_F(RetainedVersionsTest, ARepublishedVersionLeavesTheRetained) {
  RetainedVersions retained(2);
  retained.Replaced(V(1), *V(2));
  retained.Replaced(V(2), *V(3));
  retained.Replaced(V(3), *V(1));
  EXPECT_THAT(Numbers(retained), ElementsAre(3, 2));
  ASSERT_EQ(retained.Snapshots().size(), 2u);
  EXPECT_EQ(retained.Snapshots()[0], V(3));
}

TEST_F(RetainedVersionsTest, CapacityZeroKeepsNone) {
  RetainedVersions retained(0);
  retained.Replaced(V(1), *V(2));
  EXPECT_THAT(Numbers(retained), ElementsAre());
  EXPECT_EQ(retained.Find({1, path_}), nullptr);
}

// The checksum state of a version is kept while it serves or is retained,
// so that knnd_index_checksum is right again after a rollback, and
// forgotten after.
TEST_F(RetainedVersionsTest, ChecksumStatesLastAsLongAsTheirVersions) {
  RetainedVersions retained(1);
  EXPECT_EQ(retained.checksum_state(1), State::kUnchecked);
  retained.Replaced(nullptr, *V(1));
  retained.SetChecksumState(1, State::kVerified);
  retained.Replaced(V(1), *V(2));
  retained.SetChecksumState(2, State::kPending);
  EXPECT_EQ(retained.checksum_state(1), State::kVerified);  // retained
  EXPECT_EQ(retained.checksum_state(2), State::kPending);   // serving
  retained.Replaced(V(2), *V(3));
  EXPECT_EQ(retained.checksum_state(1), State::kUnchecked) << "let go";
  EXPECT_EQ(retained.checksum_state(2), State::kPending);
}

}  // namespace
}  // namespace knnd
