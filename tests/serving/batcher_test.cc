// Batcher: large requests split into units, small ones coalesced by
// (snapshot, k, nprobe, filter, refine_factor) behind busy workers or run
// inline beside an idle one, deadlines and cancellation honoured, with the
// results of a search of each request alone.
#include "knnd/serving/batcher.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "knnd/serving/serving_load.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::FindSample;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::Scrape;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteIndex;

// The production defaults with units of at most `rows` rows (and
// inline_max_rows within them, as the config check requires).
Batcher::Options UnitsOf(int rows) {
  Batcher::Options options;
  options.max_batch_rows = rows;
  options.inline_max_rows = std::min(options.inline_max_rows, rows);
  return options;
}

// Holds every worker of a pool in a task until Notify(); constructed once
// every worker is in it, so that no worker is idle (nothing submitted then
// runs inline). Destroying it releases them and waits until each has left
// the task, so that no worker still touches the notification when it goes.
class WorkerBlock {
 public:
  explicit WorkerBlock(WorkerPool* pool) : left_(pool->num_threads()) {
    for (int i = 0; i < pool->num_threads(); ++i) {
      pool->Submit([this] {
        entered_.fetch_add(1);
        release_.WaitForNotification();
        left_.fetch_sub(1);
      });
    }
    while (entered_.load() < pool->num_threads()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  ~WorkerBlock() {
    Notify();
    while (left_.load() > 0) absl::SleepFor(absl::Milliseconds(1));
  }
  void Notify() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  absl::Notification release_;
  std::atomic<int> entered_{0};
  std::atomic<int> left_;
};

// One request of a test: its buffers, the per-request truth and outcome.
struct Request {
  std::vector<float> queries;
  std::vector<float> distances;
  std::vector<int64_t> ids;
  std::vector<int64_t> want_ids;
  absl::Status status;
  std::thread::id ran_on;  // the thread its completion ran on
  absl::Notification done;
};

class BatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.n = 4000;
    WriteIndex(tmp_.path("b.index"), spec_);
    snapshot_ = LoadSnapshot(tmp_.path("b.index"));
    ASSERT_NE(snapshot_, nullptr);
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
    job->args.queries = q.data();
    job->args.num_queries = static_cast<int64_t>(q.size()) / spec_.d;
    job->args.k = k;
    job->args.nprobe = 4;
    d->assign(job->args.num_queries * k, -7.0f);
    ids->assign(job->args.num_queries * k, -7);
    job->args.distances = d->data();
    job->args.ids = ids->data();
    return job;
  }

  // Occupies every worker until the returned block's Notify(), so that jobs
  // submitted meanwhile are all queued when the workers return: what gets
  // coalesced is then decided by count, not by timing.
  std::unique_ptr<WorkerBlock> BlockWorkers() {
    return std::make_unique<WorkerBlock>(pool_.get());
  }

  // Metrics serving /metrics on a free port, to read knnd_search_batch_rows.
  std::unique_ptr<Metrics> StartMetrics() {
    Metrics::Options options;
    options.listen_address = "127.0.0.1:0";
    auto metrics = Metrics::Create(options, ServingLoad(&gate_, pool_.get()));
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_TRUE((*metrics)->StartExposer().ok());
    return std::move(*metrics);
  }

  // (FAISS calls executed, rows searched) so far.
  std::pair<double, double> BatchRows(const Metrics& metrics) {
    const auto samples = Scrape(metrics.port());
    return {FindSample(samples, "knnd_search_batch_rows_count").value_or(-1),
            FindSample(samples, "knnd_search_batch_rows_sum").value_or(-1)};
  }

  // What one FAISS call for request `r` alone returns, searched as `job`
  // asks (the per-request truth).
  static std::vector<int64_t> SearchAlone(const Request& r,
                                          const SearchJob& job) {
    return SearchSnapshot(*job.snapshot, r.queries, job.args.k,
                          job.args.nprobe, 0, job.allowed_ids_storage)
        .ids;
  }

  // A job of `rows` seeded query rows, k 5, whose outcome lands in `r`
  // (with the per-request truth in r.want_ids).
  std::unique_ptr<SearchJob> Tracked(Request& r, int rows, uint64_t seed) {
    r.queries = MakeData(rows, spec_.d, seed);
    auto job = Job(r.queries, 5, &r.distances, &r.ids);
    r.want_ids = SearchAlone(r, *job);
    job->on_done = [&r](const absl::Status& s, const JobTimes&) {
      r.status = s;
      r.ran_on = std::this_thread::get_id();
      r.done.Notify();
    };
    return job;
  }

  TempDir tmp_;
  IndexSpec spec_;
  AdmissionGate gate_{AdmissionGate::Options{}};
  std::shared_ptr<const IndexSnapshot> snapshot_;
  std::unique_ptr<WorkerPool> pool_;
};

TEST_F(BatcherTest, SplitsLargeRequestsIntoUnitsWithTheSameResults) {
  auto batcher = Batcher::Create(UnitsOf(7), pool_.get());
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
  auto batcher = Batcher::Create(Batcher::Options(), pool_.get());
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
  auto batcher = Batcher::Create(UnitsOf(2), pool_.get());
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
  auto batcher = Batcher::Create(UnitsOf(4), pool_.get());
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

// The batcher tells the gate how long each FAISS call took per work unit
// (rows x nprobe): after one request the gate's queue-time bound has a
// measured cost, so work admitted counts as waiting time.
TEST_F(BatcherTest, SearchTimeIsMeasuredForTheGatesQueueTimeBound) {
  AdmissionGate::Options options;
  options.max_inflight_queries = 100000;
  options.max_queue_time = absl::Hours(1);
  AdmissionGate gate(options);
  auto batcher = Batcher::Create(UnitsOf(4), pool_.get(), nullptr, &gate);
  ASSERT_TRUE(batcher.ok());
  {
    auto before = gate.TryAdmitWork(1, 0, 1000000);
    ASSERT_TRUE(before.ok());
    EXPECT_EQ(gate.EstimatedQueueTime(), absl::ZeroDuration());  // unmeasured
  }
  std::vector<float> q = MakeData(10, spec_.d, 4);
  std::vector<float> d;
  std::vector<int64_t> ids;
  ASSERT_TRUE(Run(**batcher, Job(q, 5, &d, &ids)).ok());
  auto after = gate.TryAdmitWork(1, 0, 1000000);
  ASSERT_TRUE(after.ok());
  EXPECT_GT(gate.EstimatedQueueTime(), absl::ZeroDuration());
}

// One request of the coalescing tests: its inputs, outputs and outcome.
TEST_F(BatcherTest, CoalescedResultsEqualPerRequestSearches) {
  // 16 rows: below FAISS's BLAS threshold (20 queries), so a batch's coarse
  // search takes the same code path as a request searched alone and ids
  // must match exactly.
  Batcher::Options options;
  options.max_batch_rows = 16;
  options.max_queue_delay_us = 1000;
  auto metrics = StartMetrics();
  auto batcher = Batcher::Create(options, pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());

  std::vector<int64_t> evens, low;
  for (int64_t i = 0; i < spec_.n; i += 2) evens.push_back(i);
  for (int64_t i = 0; i < 500; ++i) low.push_back(i);
  const std::vector<std::vector<int64_t>> filters = {{}, evens, low};

  constexpr int kThreads = 8;
  constexpr int kPerThread = 12;
  std::vector<Request> requests(kThreads * kPerThread);
  std::vector<std::unique_ptr<SearchJob>> jobs;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.queries = MakeData(1 + i % 3, spec_.d, 100 + i);
    auto job = Job(r.queries, i % 2 == 0 ? 5 : 10, &r.distances, &r.ids);
    job->args.nprobe = (i / 2) % 2 == 0 ? 2 : 4;
    job->allowed_ids_storage = filters[(i / 4) % filters.size()];
    job->args.allowed_ids = job->allowed_ids_storage;
    r.want_ids = SearchAlone(r, *job);
    job->on_done = [&r](const absl::Status& s, const JobTimes&) {
      r.status = s;
      r.done.Notify();
    };
    jobs.push_back(std::move(job));
  }

  auto release = BlockWorkers();
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = t; i < static_cast<int>(jobs.size()); i += kThreads) {
        (*batcher)->Submit(std::move(jobs[i]));
      }
    });
  }
  for (auto& t : submitters) t.join();
  release->Notify();
  int64_t rows = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.done.WaitForNotification();
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, r.want_ids) << "request " << i;
    rows += static_cast<int64_t>(r.queries.size()) / spec_.d;
  }
  const auto [batches, sum] = BatchRows(*metrics);
  EXPECT_EQ(sum, rows);
  EXPECT_LT(batches, static_cast<double>(requests.size()))
      << "nothing was coalesced";
}

TEST_F(BatcherTest, RequestsWithDifferentKeysAreNeverMerged) {
  auto metrics = StartMetrics();
  auto batcher =
      Batcher::Create(Batcher::Options(), pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());
  std::shared_ptr<const IndexSnapshot> other_snapshot =
      LoadSnapshot(tmp_.path("b.index"));
  ASSERT_NE(other_snapshot, nullptr);

  // Seven one-row requests; only the first two share a key.
  std::vector<Request> requests(7);
  std::vector<std::unique_ptr<SearchJob>> jobs;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.queries = MakeData(1, spec_.d, 200 + i);
    auto job = Job(r.queries, i == 2 ? 6 : 5, &r.distances, &r.ids);
    job->on_done = [&r](const absl::Status& s, const JobTimes&) {
      r.status = s;
      r.done.Notify();
    };
    jobs.push_back(std::move(job));
  }
  jobs[3]->args.nprobe = 8;
  jobs[4]->allowed_ids_storage = {1, 2, 3};
  jobs[4]->args.allowed_ids = jobs[4]->allowed_ids_storage;
  jobs[5]->allowed_ids_storage = {1, 2, 4};
  jobs[5]->args.allowed_ids = jobs[5]->allowed_ids_storage;
  jobs[6]->snapshot = other_snapshot;  // another version of the same file

  auto release = BlockWorkers();
  for (auto& job : jobs) (*batcher)->Submit(std::move(job));
  release->Notify();
  for (Request& r : requests) {
    r.done.WaitForNotification();
    EXPECT_TRUE(r.status.ok()) << r.status;
  }
  const auto [batches, rows] = BatchRows(*metrics);
  EXPECT_EQ(rows, 7);
  EXPECT_EQ(batches, 6) << "only the two requests with equal keys merge";
}

TEST_F(BatcherTest, ExpiredRequestInABatchIsNotSearchedButItsNeighboursAre) {
  // One worker: no idle neighbour to share the queue with, so the three
  // requests form one batch.
  auto pool = WorkerPool::Create({1, 1});
  ASSERT_TRUE(pool.ok());
  pool_ = std::move(*pool);
  auto metrics = StartMetrics();
  auto batcher =
      Batcher::Create(Batcher::Options(), pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<Request> requests(3);
  std::vector<std::unique_ptr<SearchJob>> jobs;
  for (size_t i = 0; i < requests.size(); ++i) {
    jobs.push_back(Tracked(requests[i], 2, 300 + i));
  }
  jobs[1]->deadline = absl::Now() - absl::Milliseconds(1);

  auto release = BlockWorkers();
  for (auto& job : jobs) (*batcher)->Submit(std::move(job));
  release->Notify();
  for (Request& r : requests) r.done.WaitForNotification();
  EXPECT_TRUE(requests[0].status.ok()) << requests[0].status;
  EXPECT_TRUE(requests[2].status.ok()) << requests[2].status;
  EXPECT_EQ(requests[0].ids, requests[0].want_ids);
  EXPECT_EQ(requests[2].ids, requests[2].want_ids);
  EXPECT_EQ(requests[1].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(requests[1].ids, std::vector<int64_t>(10, -7))
      << "the expired request was searched";
  EXPECT_EQ(BatchRows(*metrics), std::make_pair(1.0, 4.0))
      << "one FAISS call over the two live requests";
}

// Three workers free up with six one-row requests of one key queued: each
// batch takes at most its share (queued rows / idle workers, 2 here), so the
// work spreads over the workers instead of one worker merging all six while
// the others idle.
TEST_F(BatcherTest, CoalescingLeavesNoWorkerIdleBesideTheQueue) {
  ASSERT_EQ(pool_->num_threads(), 3);
  auto metrics = StartMetrics();
  auto batcher =
      Batcher::Create(Batcher::Options(), pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<Request> requests(6);
  auto release = BlockWorkers();
  for (size_t i = 0; i < requests.size(); ++i) {
    (*batcher)->Submit(Tracked(requests[i], 1, 600 + i));
  }
  release->Notify();
  for (Request& r : requests) {
    r.done.WaitForNotification();
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, r.want_ids);
  }
  const auto [batches, rows] = BatchRows(*metrics);
  EXPECT_EQ(rows, 6);
  EXPECT_GE(batches, 3) << "one worker merged more than its share";
  EXPECT_LT(batches, 6) << "nothing was coalesced";
}

// A small request that finds a worker idle and nothing queued is searched on
// the submitting thread (no hand-off); with every worker busy it waits in
// the queue for one, and a larger request always goes to the workers.
TEST_F(BatcherTest, SmallRequestsRunInlineOnlyWhileAWorkerIsIdle) {
  Batcher::Options options;
  options.inline_max_rows = 2;
  auto batcher = Batcher::Create(options, pool_.get());
  ASSERT_TRUE(batcher.ok());
  while (pool_->idle_threads() < pool_->num_threads()) {
    absl::SleepFor(absl::Milliseconds(1));
  }

  const std::thread::id me = std::this_thread::get_id();

  Request small;
  (*batcher)->Submit(Tracked(small, 2, 700));
  ASSERT_TRUE(small.done.HasBeenNotified()) << "not searched within Submit";
  EXPECT_TRUE(small.status.ok()) << small.status;
  EXPECT_EQ(small.ran_on, me);
  EXPECT_EQ(small.ids, small.want_ids);

  Request large;
  (*batcher)->Submit(Tracked(large, 3, 701));
  large.done.WaitForNotification();
  EXPECT_TRUE(large.status.ok()) << large.status;
  EXPECT_NE(large.ran_on, me) << "a request above inline_max_rows ran inline";
  EXPECT_EQ(large.ids, large.want_ids);

  auto release = BlockWorkers();
  Request queued;
  (*batcher)->Submit(Tracked(queued, 1, 702));
  EXPECT_FALSE(queued.done.HasBeenNotified())
      << "searched inline while every worker was busy";
  release->Notify();
  queued.done.WaitForNotification();
  EXPECT_TRUE(queued.status.ok()) << queued.status;
  EXPECT_NE(queued.ran_on, me);
  EXPECT_EQ(queued.ids, queued.want_ids);
}

TEST_F(BatcherTest, ConcurrentSingleQueriesAreCoalescedWithAQueueDelay) {
  Batcher::Options options;
  options.max_batch_rows = 8;  // full batches end the wait early
  options.max_queue_delay_us = 20000;
  // Searched inline beside an idle worker, a request is never queued to be
  // coalesced: this test is of the queue.
  options.inline_max_rows = 0;
  auto metrics = StartMetrics();
  auto batcher = Batcher::Create(options, pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());
  constexpr int kClients = 32;
  constexpr int kRequestsEach = 20;
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::vector<float> q = MakeData(1, spec_.d, 400 + c);
      for (int i = 0; i < kRequestsEach; ++i) {
        std::vector<float> d;
        std::vector<int64_t> ids;
        if (!Run(**batcher, Job(q, 10, &d, &ids)).ok()) ++failures;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto [batches, rows] = BatchRows(*metrics);
  EXPECT_EQ(rows, kClients * kRequestsEach);
  EXPECT_GT(rows / batches, 1.0) << batches << " batches";
}

TEST_F(BatcherTest, WithoutCoalescingEveryUnitIsItsOwnCall) {
  Batcher::Options options;
  options.coalesce = false;
  auto metrics = StartMetrics();
  auto batcher = Batcher::Create(options, pool_.get(), metrics.get());
  ASSERT_TRUE(batcher.ok());
  std::vector<Request> requests(5);
  auto release = BlockWorkers();
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.queries = MakeData(1, spec_.d, 500 + i);
    auto job = Job(r.queries, 5, &r.distances, &r.ids);
    job->on_done = [&r](const absl::Status& s, const JobTimes&) {
      r.status = s;
      r.done.Notify();
    };
    (*batcher)->Submit(std::move(job));
  }
  release->Notify();
  for (Request& r : requests) r.done.WaitForNotification();
  EXPECT_EQ(BatchRows(*metrics), std::make_pair(5.0, 5.0));
}

constexpr int kRows = 2000;
constexpr int kDim = 16;
constexpr int kK = 10;

// Coalescing never merges requests of different refine_factor: queued
// together behind busy workers, each request still gets the results of its
// own refine_factor.
TEST(Rerank, BatcherKeepsRefineFactorsApart) {
  TempDir tmp;
  BuildSpec spec;  // PQ4 ranks poorly: re-ranking changes the answers
  spec.n = kRows;
  spec.d = kDim;
  spec.seed = 5;
  spec.factory = "IVF16,PQ4";
  spec.vectors = VectorsDtype::kFloat32;
  BuildIndex(tmp.path("x.index"), spec);
  LoadOptions required;
  required.vectors = VectorsPolicy::kRequired;
  std::shared_ptr<const IndexSnapshot> snapshot =
      LoadSnapshot(tmp.path("x.index"), required);
  ASSERT_NE(snapshot, nullptr);
  auto pool = WorkerPool::Create({1, 1});
  ASSERT_TRUE(pool.ok());
  Batcher::Options options;
  options.coalesce = true;
  auto batcher = Batcher::Create(options, pool->get());
  ASSERT_TRUE(batcher.ok());

  constexpr int kJobs = 8;
  std::vector<std::vector<float>> queries(kJobs);
  std::vector<std::vector<float>> distances(kJobs);
  std::vector<std::vector<int64_t>> ids(kJobs), want(kJobs);
  std::vector<absl::Notification> done(kJobs);
  WorkerBlock busy(pool->get());
  for (int i = 0; i < kJobs; ++i) {
    queries[i] = MakeData(3, kDim, 200 + i);
    const int refine = i % 2 == 0 ? 0 : kRows / kK;
    want[i] = SearchSnapshot(*snapshot, queries[i], kK, 2, refine).ids;
    distances[i].resize(3 * kK);
    ids[i].resize(3 * kK);
    auto job = std::make_unique<SearchJob>();
    job->snapshot = snapshot;
    job->args.queries = queries[i].data();
    job->args.num_queries = 3;
    job->args.k = kK;
    job->args.nprobe = 2;
    job->args.refine_factor = refine;
    job->args.distances = distances[i].data();
    job->args.ids = ids[i].data();
    job->on_done = [&done, i](const absl::Status& s, const JobTimes&) {
      EXPECT_TRUE(s.ok()) << s;
      done[i].Notify();
    };
    (*batcher)->Submit(std::move(job));
  }
  busy.Notify();
  for (int i = 0; i < kJobs; ++i) {
    done[i].WaitForNotification();
    EXPECT_EQ(ids[i], want[i]) << "request " << i;
  }
  EXPECT_NE(want[0],
            SearchSnapshot(*snapshot, queries[0], kK, 2, kRows / kK).ids);
}

}  // namespace
}  // namespace knnd
