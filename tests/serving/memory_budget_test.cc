// MemoryBudget with the production defaults: the limit it resolves, the
// heap check of a version about to load beside the one serving, and the
// gate's byte budget it sets once a version serves.
#include "knnd/serving/memory_budget.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteIndex(tmp_.path("v.index"), VersionSpec(1));
    snapshot_ = LoadSnapshot(tmp_.path("v.index"));
    ASSERT_NE(snapshot_, nullptr);
  }

  // The production defaults, reading /proc and the cgroup filesystem from
  // an empty folder: no cgroup limit.
  MemoryBudget::Options Defaults() {
    MemoryBudget::Options options;
    options.proc_root = tmp_.path("proc");
    options.cgroup_root = tmp_.path("cgroup");
    return options;
  }

  // The served index's facts with `heap_bytes` of heap.
  IndexInfo WithHeap(int64_t heap_bytes) {
    IndexInfo info = snapshot_->info();
    info.heap_bytes = heap_bytes;
    info.read_peak_extra_bytes = 0;
    return info;
  }

  TempDir tmp_;
  std::shared_ptr<const IndexSnapshot> snapshot_;
  AdmissionGate gate_{AdmissionGate::Options()};
  IndexHolder holder_;
};

// Without any limit the gate keeps max_inflight_bytes (1 GiB by default)
// and every version fits.
TEST_F(MemoryBudgetTest, WithoutALimitMaxInflightBytesApplies) {
  std::unique_ptr<MemoryBudget> budget =
      MemoryBudget::Create(Defaults(), &gate_, &holder_);
  EXPECT_EQ(budget->limits().limit_bytes, 0);
  EXPECT_EQ(budget->limits().headroom_bytes, 128 * kMiB);
  EXPECT_TRUE(budget->CheckHeap(WithHeap(int64_t{1} << 40)).ok());
  budget->SetByteBudgetFor(WithHeap(100 * kMiB));
  EXPECT_EQ(gate_.max_inflight_bytes(), int64_t{1} << 30);
}

// With a limit the budget is inflight_bytes_limit_percent (50%) of what
// the index and the headroom leave, (1024 - 100 - 128) MiB, counted in
// whole hundredths.
TEST_F(MemoryBudgetTest, BudgetIsAShareOfWhatTheIndexLeaves) {
  MemoryBudget::Options options = Defaults();
  options.configured_limit_bytes = 1024 * kMiB;
  std::unique_ptr<MemoryBudget> budget =
      MemoryBudget::Create(options, &gate_, &holder_);
  EXPECT_EQ(budget->limits().limit_bytes, 1024 * kMiB);
  budget->SetByteBudgetFor(WithHeap(100 * kMiB));
  EXPECT_EQ(gate_.max_inflight_bytes(), 796 * kMiB / 100 * 50);
}

TEST_F(MemoryBudgetTest, ConfiguredMaxInflightBytesStaysFixed) {
  MemoryBudget::Options options = Defaults();
  options.configured_limit_bytes = 1024 * kMiB;
  options.max_inflight_bytes = 64 * kMiB;
  options.max_inflight_bytes_configured = true;
  AdmissionGate::Options gate_options;
  gate_options.max_inflight_bytes = 64 * kMiB;
  AdmissionGate gate(gate_options);
  std::unique_ptr<MemoryBudget> budget =
      MemoryBudget::Create(options, &gate, &holder_);
  budget->SetByteBudgetFor(WithHeap(100 * kMiB));
  EXPECT_EQ(gate.max_inflight_bytes(), 64 * kMiB);
}

// A version about to load must fit beside the one serving and the
// headroom; the refusal names the sizes.
TEST_F(MemoryBudgetTest, CheckHeapCountsTheVersionServing) {
  const int64_t serving = snapshot_->info().heap_bytes;
  ASSERT_GT(serving, 0);
  const int64_t planned = 10 * kMiB;
  MemoryBudget::Options options = Defaults();
  options.configured_limit_bytes = planned + serving + options.headroom_bytes;
  std::unique_ptr<MemoryBudget> budget =
      MemoryBudget::Create(options, &gate_, &holder_);
  EXPECT_TRUE(budget->CheckHeap(WithHeap(planned)).ok()) << "none serving";
  holder_.Publish(snapshot_);
  EXPECT_TRUE(budget->CheckHeap(WithHeap(planned)).ok()) << "exactly fits";
  absl::Status refused = budget->CheckHeap(WithHeap(planned + 1));
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("of the version still serving"));
}

}  // namespace
}  // namespace knnd
