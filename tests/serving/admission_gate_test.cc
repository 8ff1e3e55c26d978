#include "knnd/serving/admission_gate.h"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "knnd/base/saturating.h"

namespace knnd {
namespace {

AdmissionGate::Options Budget(int64_t queries, int64_t bytes) {
  AdmissionGate::Options options;
  options.max_inflight_queries = queries;
  options.max_inflight_bytes = bytes;
  return options;
}

TEST(AdmissionGate, AdmitsUpToTheQueryBudgetThenRefusesWithResourceExhausted) {
  AdmissionGate gate(Budget(10, 0));
  auto a = gate.TryAdmit(6, 100);
  ASSERT_TRUE(a.ok());
  auto b = gate.TryAdmit(4, 100);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(gate.queries_in_flight(), 10);
  RejectReason reason;
  auto c = gate.TryAdmit(1, 1, &reason);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kQueueFull);
  EXPECT_NE(c.status().message().find("max_inflight_queries=10"),
            std::string::npos)
      << c.status();
}

TEST(AdmissionGate, RefusesOverTheByteBudget) {
  AdmissionGate gate(Budget(100, 1000));
  auto a = gate.TryAdmit(1, 900);
  ASSERT_TRUE(a.ok());
  RejectReason reason;
  auto b = gate.TryAdmit(1, 200, &reason);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kMemoryBudget);
  EXPECT_NE(b.status().message().find("max_inflight_bytes=1000"),
            std::string::npos);
}

// The queue-time bound: with 2 workers and 1 us measured per work unit, the
// work admitted keeps the workers busy for (units in flight) / 2 us; a new
// request is refused (kQueueTime) once that passes max_queue_time, never
// before anything was measured or while nothing is in flight, and admitted
// again when the work is released.
TEST(AdmissionGate, RefusesWhileTheWorkAdmittedExceedsTheQueueTime) {
  AdmissionGate::Options options = Budget(1000000, 0);
  options.max_queue_time = absl::Milliseconds(10);
  options.num_workers = 2;
  AdmissionGate gate(options);
  // Nothing measured yet: work counts as 0, everything is admitted.
  auto unmeasured = gate.TryAdmitWork(1, 1, 1000000);
  ASSERT_TRUE(unmeasured.ok());
  EXPECT_EQ(gate.EstimatedQueueTime(), absl::ZeroDuration());
  unmeasured->Release();
  gate.RecordWork(1000, absl::Milliseconds(1));  // 1 us per unit
  // 30000 units = 30 ms of work on 2 workers: a 15 ms wait.
  auto big = gate.TryAdmitWork(10, 1, 30000);
  ASSERT_TRUE(big.ok());  // nothing in flight: admitted whatever its size
  EXPECT_EQ(gate.EstimatedQueueTime(), absl::Milliseconds(15));
  RejectReason reason;
  auto refused = gate.TryAdmitWork(1, 1, 1, &reason);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kQueueTime);
  EXPECT_NE(refused.status().message().find("max_queue_time_ms=10"),
            std::string::npos)
      << refused.status();
  big->Release();
  EXPECT_EQ(gate.EstimatedQueueTime(), absl::ZeroDuration());
  // 15000 units: 7.5 ms, within the bound: a second one still fits.
  auto a = gate.TryAdmitWork(1, 1, 15000);
  ASSERT_TRUE(a.ok());
  auto b = gate.TryAdmitWork(1, 1, 15000);
  ASSERT_TRUE(b.ok());  // 7.5 ms ahead of it
  auto c = gate.TryAdmitWork(1, 1, 1, &reason);
  EXPECT_FALSE(c.ok());  // 15 ms ahead
  // The measured time per unit follows new measurements (weight 1/8).
  gate.RecordWork(1000, absl::Milliseconds(9));  // 9 us per unit
  a->Release();
  b->Release();
  auto d = gate.TryAdmitWork(1, 1, 15000);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(gate.EstimatedQueueTime(), absl::Microseconds(15000));  // 2 us / 2
}

// Without max_queue_time the work in flight never refuses a request.
TEST(AdmissionGate, NoQueueTimeBoundByDefault) {
  AdmissionGate gate(Budget(1000000, 0));
  gate.RecordWork(1, absl::Seconds(1));
  auto a = gate.TryAdmitWork(1, 1, 1000);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(gate.TryAdmitWork(1, 1, 1000).ok());
}

TEST(AdmissionGate, RequestLargerThanABudgetIsInvalidNotRetryable) {
  AdmissionGate gate(Budget(10, 1000));
  RejectReason reason;
  auto a = gate.TryAdmit(11, 1, &reason);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reason, RejectReason::kTooLarge);
  auto b = gate.TryAdmit(1, 1001, &reason);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reason, RejectReason::kTooLarge);
}

// An estimate that wrapped negative lowered the bytes counted in flight,
// so that others passed the budget; one that saturated made every later
// sum overflow. Both are refused, with or without a byte budget.
TEST(AdmissionGate, NegativeOrSaturatedEstimatesAreRefused) {
  for (int64_t budget : {int64_t{1000}, int64_t{0}}) {
    AdmissionGate gate(Budget(10, budget));
    RejectReason reason;
    for (int64_t bytes : {int64_t{-206000000000}, kSaturated}) {
      auto refused = gate.TryAdmit(1, bytes, &reason);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
          << bytes << " budget " << budget;
      EXPECT_EQ(reason, RejectReason::kTooLarge);
      EXPECT_EQ(gate.bytes_in_flight(), 0) << bytes;
    }
    // Without a budget, a sum that would overflow is refused too.
    if (budget == 0) {
      auto a = gate.TryAdmit(1, kSaturated - 10);
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(gate.TryAdmit(1, 20).status().code(),
                absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(gate.bytes_in_flight(), kSaturated - 10);
    }
  }
}

TEST(AdmissionGate, TicketReleasesOnDestructionAndMoveKeepsOneOwner) {
  AdmissionGate gate(Budget(10, 100));
  {
    auto a = gate.TryAdmit(7, 70);
    ASSERT_TRUE(a.ok());
    AdmissionGate::Ticket moved = std::move(*a);
    EXPECT_EQ(gate.queries_in_flight(), 7);
    AdmissionGate::Ticket again;
    again = std::move(moved);
    EXPECT_EQ(gate.queries_in_flight(), 7);
    EXPECT_EQ(gate.bytes_in_flight(), 70);
    again.Release();
    again.Release();  // idempotent
    EXPECT_EQ(gate.queries_in_flight(), 0);
  }
  EXPECT_EQ(gate.queries_in_flight(), 0);
  EXPECT_EQ(gate.bytes_in_flight(), 0);
}

TEST(AdmissionGate, DrainingRefusesWithUnavailableAndWaitsForIdle) {
  AdmissionGate gate(Budget(10, 0));
  auto held = gate.TryAdmit(3, 0);
  ASSERT_TRUE(held.ok());
  gate.StartDraining();
  RejectReason reason;
  auto refused = gate.TryAdmit(1, 0, &reason);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reason, RejectReason::kDraining);
  EXPECT_FALSE(gate.WaitUntilIdle(absl::Now() + absl::Milliseconds(20)));
  std::thread releaser([&] { held->Release(); });
  EXPECT_TRUE(gate.WaitUntilIdle(absl::InfiniteFuture()));
  releaser.join();
}

// Many threads admit random shapes; a watcher checks the budgets are never
// exceeded and at the end every admitted byte has been given back.
TEST(AdmissionGate, ConcurrentRandomRequestsNeverExceedBudgetsAndAllRelease) {
  constexpr int64_t kMaxQueries = 500;
  constexpr int64_t kMaxBytes = 1 << 20;
  AdmissionGate gate(Budget(kMaxQueries, kMaxBytes));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> admitted{0};
  std::atomic<int64_t> over{0};
  std::thread watcher([&] {
    while (!stop.load()) {
      if (gate.queries_in_flight() > kMaxQueries ||
          gate.bytes_in_flight() > kMaxBytes) {
        over.fetch_add(1);
      }
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<int64_t> queries(1, 100);
      std::uniform_int_distribution<int64_t> bytes(1, 200000);
      for (int i = 0; i < 5000; ++i) {
        auto ticket = gate.TryAdmit(queries(rng), bytes(rng));
        if (ticket.ok()) admitted.fetch_add(1);
      }
    });
  }
  for (auto& c : clients) c.join();
  stop = true;
  watcher.join();
  EXPECT_EQ(over.load(), 0);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(gate.queries_in_flight(), 0);
  EXPECT_EQ(gate.bytes_in_flight(), 0);
}

// Threads hold tickets of random sizes for a random while, counting what
// they hold themselves (added after admission, removed before release), while
// the budget is lowered and raised as a hot swap would: the bytes held never
// exceed the largest budget in force, and all are given back.
TEST(AdmissionGate, HeldBytesStayWithinTheBudgetWhileItChanges) {
  constexpr int64_t kHigh = 4 << 20;
  constexpr int64_t kLow = 1 << 20;
  AdmissionGate gate(Budget(1 << 20, kHigh));
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> admitted{0};
  std::atomic<int64_t> refused{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int64_t> bytes(1, 600000);
      std::uniform_int_distribution<int> spins(0, 20);
      for (int i = 0; i < 1000; ++i) {
        const int64_t want = bytes(rng);
        auto ticket = gate.TryAdmit(1, want);
        if (!ticket.ok()) {
          refused.fetch_add(1);
          continue;
        }
        admitted.fetch_add(1);
        const int64_t now = held.fetch_add(want) + want;
        int64_t p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        for (int s = spins(rng); s > 0; --s) std::this_thread::yield();
        held.fetch_sub(want);
        ticket->Release();
      }
    });
  }
  std::thread changer([&] {
    for (int i = 0; i < 50; ++i) {
      gate.SetMaxInflightBytes(i % 2 == 0 ? kLow : kHigh);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gate.SetMaxInflightBytes(kHigh);
  });
  for (auto& c : clients) c.join();
  changer.join();
  EXPECT_LE(peak.load(), kHigh);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(held.load(), 0);
  EXPECT_EQ(gate.queries_in_flight(), 0);
  EXPECT_EQ(gate.bytes_in_flight(), 0);
  EXPECT_EQ(gate.max_inflight_bytes(), kHigh);
}

TEST(AdmissionGate, LoweredBudgetRefusesNewRequestsUntilEnoughIsReleased) {
  AdmissionGate gate(Budget(100, 1000));
  auto a = gate.TryAdmit(1, 800);
  ASSERT_TRUE(a.ok());
  gate.SetMaxInflightBytes(500);
  RejectReason reason;
  auto b = gate.TryAdmit(1, 100, &reason);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kMemoryBudget);
  auto c = gate.TryAdmit(1, 600, &reason);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reason, RejectReason::kTooLarge);
  a->Release();
  EXPECT_TRUE(gate.TryAdmit(1, 500).ok());
}

}  // namespace
}  // namespace knnd
