// WorkerPool: its threads run at the configured nice increment and carry
// their name; a caller that searches itself takes only the OpenMP setting.
#include "knnd/serving/worker_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

// The nice value and name of the calling thread.
std::pair<int, std::string> ThisThread() {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return {getpriority(PRIO_PROCESS, tid), name};
}

// worker_nice: the workers (and only they) run at the process's nice value
// plus the increment, capped at 19, so that gRPC's threads run first on
// full cores; they are named for top -H and perf. The config check refuses
// an increment above 19.
TEST(WorkerPool, WorkersRunAtTheirNiceIncrement) {
  const int base = ThisThread().first;
  for (int increment : {0, 7, 19}) {
    WorkerPool::Options options;
    options.num_threads = 2;
    options.nice_increment = increment;
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::pair<int, std::string> seen;
    absl::Notification done;
    (*pool)->Submit([&] {
      seen = ThisThread();
      done.Notify();
    });
    done.WaitForNotification();
    EXPECT_EQ(seen.first, std::min(19, base + increment)) << increment;
    EXPECT_EQ(seen.second, "knnd-worker");
    // A caller that searches itself (Batcher's inline runs, on gRPC's
    // thread) takes the OpenMP setting, not the nice value.
    (*pool)->ApplyThreadSettings();
    EXPECT_EQ(ThisThread().first, base);
  }
  WorkerPool::Options negative;
  negative.nice_increment = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(WorkerPool::Create(negative).status()));

  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("b.index");
  EXPECT_EQ(config.worker_nice(), 10u);
  config.set_worker_nice(20);
  ::knnd::testing::ExpectConfigRefused(
      config, "worker_nice=20 is outside [0, 19]");
}

// all_idle(), which lets knnd's gRPC threads poll: true once every worker
// waits for a task, false while one runs a task, true again after it.
TEST(WorkerPool, AllIdleOnlyWhileNoTaskRuns) {
  WorkerPool::Options options;
  options.num_threads = 2;
  absl::StatusOr<std::unique_ptr<WorkerPool>> created =
      WorkerPool::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  WorkerPool& pool = **created;
  auto wait_all_idle = [&pool] {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (!pool.all_idle() && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return pool.all_idle();
  };
  ASSERT_TRUE(wait_all_idle()) << "workers started";
  absl::Notification running;
  absl::Notification release;
  pool.Submit([&] {
    running.Notify();
    release.WaitForNotification();
  });
  running.WaitForNotification();
  EXPECT_FALSE(pool.all_idle());
  EXPECT_EQ(pool.idle_threads(), 1);
  release.Notify();
  EXPECT_TRUE(wait_all_idle()) << "the task ended";
}

}  // namespace
}  // namespace knnd
