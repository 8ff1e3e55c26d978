#include "knnd/batcher.h"

#include <atomic>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteIndex;

class BatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.n = 4000;
    WriteIndex(tmp_.path("b.index"), spec_);
    auto s = IndexSnapshot::Load(tmp_.path("b.index"), {});
    ASSERT_TRUE(s.ok()) << s.status();
    snapshot_ = std::move(*s);
    auto pool = WorkerPool::Create({3, 1});
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }

  // Runs one job to completion and returns its status.
  absl::Status Run(Batcher& batcher, std::unique_ptr<SearchJob> job,
                   JobTimes* times = nullptr) {
    absl::Notification done;
    absl::Status result;
    job->on_done = [&](const absl::Status& s, const JobTimes& t) {
      result = s;
      if (times != nullptr) *times = t;
      done.Notify();
    };
    batcher.Submit(std::move(job));
    done.WaitForNotification();
    return result;
  }

  std::unique_ptr<SearchJob> Job(const std::vector<float>& q, int k,
                                 std::vector<float>* d,
                                 std::vector<int64_t>* ids) {
    auto job = std::make_unique<SearchJob>();
    job->snapshot = snapshot_;
    job->queries = q.data();
    job->num_queries = static_cast<int64_t>(q.size()) / spec_.d;
    job->k = k;
    job->nprobe = 4;
    d->assign(job->num_queries * k, -7.0f);
    ids->assign(job->num_queries * k, -7);
    job->distances = d->data();
    job->ids = ids->data();
    return job;
  }

  TempDir tmp_;
  IndexSpec spec_;
  std::shared_ptr<const IndexSnapshot> snapshot_;
  std::unique_ptr<WorkerPool> pool_;
};

TEST_F(BatcherTest, SplitsLargeRequestsIntoUnitsWithTheSameResults) {
  auto batcher = Batcher::Create({7}, pool_.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<float> q = MakeData(50, spec_.d, 4);
  std::vector<float> d;
  std::vector<int64_t> ids;
  JobTimes times;
  ASSERT_TRUE(Run(**batcher, Job(q, 10, &d, &ids), &times).ok());
  EXPECT_EQ(times.units, 8);  // ceil(50 / 7)
  std::vector<float> want_d;
  std::vector<int64_t> want_i;
  ReferenceSearch(tmp_.path("b.index"), q, 10, 4, &want_d, &want_i);
  EXPECT_EQ(ids, want_i);
}

TEST_F(BatcherTest, ExpiredDeadlineIsNotSearched) {
  auto batcher = Batcher::Create({256}, pool_.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<float> q = MakeData(3, spec_.d, 4);
  std::vector<float> d;
  std::vector<int64_t> ids;
  auto job = Job(q, 5, &d, &ids);
  job->deadline = absl::Now() - absl::Milliseconds(1);
  absl::Status s = Run(**batcher, std::move(job));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ids, std::vector<int64_t>(15, -7)) << "the search ran anyway";
}

TEST_F(BatcherTest, CancelledRequestIsDropped) {
  auto batcher = Batcher::Create({2}, pool_.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<float> q = MakeData(6, spec_.d, 4);
  std::vector<float> d;
  std::vector<int64_t> ids;
  auto job = Job(q, 5, &d, &ids);
  job->is_cancelled = [] { return true; };
  EXPECT_EQ(Run(**batcher, std::move(job)).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(ids, std::vector<int64_t>(30, -7));
}

TEST_F(BatcherTest, TicketIsReleasedAfterCompletion) {
  auto batcher = Batcher::Create({4}, pool_.get());
  ASSERT_TRUE(batcher.ok());
  AdmissionGate gate({100, 0});
  std::vector<float> q = MakeData(10, spec_.d, 4);
  std::vector<float> d;
  std::vector<int64_t> ids;
  auto job = Job(q, 5, &d, &ids);
  auto ticket = gate.TryAdmit(10, 0);
  ASSERT_TRUE(ticket.ok());
  job->ticket = std::move(*ticket);
  ASSERT_TRUE(Run(**batcher, std::move(job)).ok());
  EXPECT_TRUE(gate.WaitUntilIdle(absl::Now() + absl::Seconds(10)));
}

}  // namespace
}  // namespace knnd
