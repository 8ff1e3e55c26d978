// The index probe (index/index_probe.h) as IndexSnapshot::Load runs it: a
// fresh process image rather than a fork of the caller, killed and reaped
// when it does not answer in time.
#include "knnd/index/index_probe.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_snapshot.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

// While set, a child forked by this process exits at once (status 97).
std::atomic<bool> exit_in_forked_children{false};

// The probe is a new process image, not a fork of the caller: in a forked
// copy of a multi-threaded server, a lock another thread held at the fork
// stays held (the sanitizers' allocators hung CI that way). A fork would run
// the fork handler below; the probe must still answer, and still refuse a
// corrupt file with the reader's message.
TEST(IndexSnapshot, ProbeIsAFreshProcessNotAFork) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] {
      if (exit_in_forked_children) _exit(97);
    });
    return true;
  }();
  ASSERT_TRUE(registered);
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  WriteFile(tmp.path("cut.index"),
            ReadFile(tmp.path("good.index")).substr(0, 40));
  LoadOptions options;
  options.probe_in_subprocess = true;
  exit_in_forked_children = true;
  auto good = IndexSnapshot::Load(tmp.path("good.index"), options);
  auto cut = IndexSnapshot::Load(tmp.path("cut.index"), options);
  exit_in_forked_children = false;
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->info().ntotal, spec.n);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.index"));
}

// A probe that never answers (as on a filesystem that hangs) is killed once
// probe_timeout has passed, and the load fails with DEADLINE_EXCEEDED
// instead of waiting for ever; the probe is reaped. tests/test_main.cc makes
// the probe hang while KNND_TEST_PROBE_HANGS is set.
TEST(IndexSnapshot, ProbeThatNeverAnswersIsKilledAfterItsTimeout) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  LoadOptions options;
  options.probe_in_subprocess = true;
  options.probe_timeout = absl::Milliseconds(300);
  ASSERT_EQ(setenv("KNND_TEST_PROBE_HANGS", "1", 1), 0);
  auto hung = IndexSnapshot::Load(tmp.path("good.index"), options);
  ASSERT_EQ(unsetenv("KNND_TEST_PROBE_HANGS"), 0);
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded)
      << hung.status();
  EXPECT_THAT(hung.status().message(), HasSubstr("good.index"));
  EXPECT_THAT(hung.status().message(), HasSubstr("index_probe_timeout_s"));
  // No child left, not even a zombie.
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  // The same file loads with a probe that answers (a generous limit: a
  // sanitizer build starts slowly).
  options.probe_timeout = absl::Minutes(5);
  auto good = IndexSnapshot::Load(tmp.path("good.index"), options);
  ASSERT_TRUE(good.ok()) << good.status();

  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("x.index");
  EXPECT_EQ(config.index_probe_timeout_s(), 300u);
  config.set_index_probe_timeout_s(0);
  ::knnd::testing::ExpectConfigRefused(
      config, "index_probe_timeout_s=0 is outside [1, 86400]");
}

}  // namespace
}  // namespace knnd
