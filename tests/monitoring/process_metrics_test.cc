// ProcessMetrics' cgroup series (knnd_cgroup_memory_*) from the knnd binary
// run inside a memory cgroup of its own: that cgroup's limit, and no limit
// series when the cgroup has none. Needs root and a writable memory
// controller (cgroup v1 or v2); skipped otherwise. The process_* and
// knnd_process_* series of an in-process server are in metrics_test.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "knnd/monitoring/kernel_files.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FindSample;
using ::knnd::testing::FreePort;
using ::knnd::testing::HttpGet;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::ParseExposition;
using ::knnd::testing::Sample;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteIndex;

constexpr int64_t kLimitBytes = int64_t{768} << 20;

// A fresh memory cgroup directly under the hierarchy's root, removed on
// destruction.
class TestCgroup {
 public:
  TestCgroup() {
    const std::string name = absl::StrCat("knnd_metrics_test_", getpid());
    if (access("/sys/fs/cgroup/memory/memory.limit_in_bytes", W_OK) == 0 ||
        access("/sys/fs/cgroup/memory/cgroup.procs", W_OK) == 0) {
      dir_ = "/sys/fs/cgroup/memory/" + name;
      limit_file_ = "memory.limit_in_bytes";
    } else if (absl::StrContains(
                   ReadKernelFile("/sys/fs/cgroup/cgroup.subtree_control")
                       .value_or(""),
                   "memory")) {
      dir_ = "/sys/fs/cgroup/" + name;
      limit_file_ = "memory.max";
    }
    if (!dir_.empty() && mkdir(dir_.c_str(), 0755) != 0) dir_.clear();
  }
  ~TestCgroup() {
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  bool ok() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  bool SetLimit(int64_t bytes) const {
    std::ofstream(dir_ + "/" + limit_file_) << bytes;
    return ReadKernelFile(dir_ + "/" + limit_file_).value_or("") ==
           absl::StrCat(bytes, "\n");
  }

 private:
  std::string dir_;
  std::string limit_file_;
};

// Runs knnd inside `cgroup` until it serves; returns its first scrape.
std::vector<Sample> ScrapeDaemonIn(const TestCgroup& cgroup,
                                   const std::string& index) {
  const int metrics_port = FreePort();
  const std::string procs = cgroup.dir() + "/cgroup.procs";
  const std::vector<std::string> args = {
      KNND_BINARY, "--index", index, "--listen", "127.0.0.1:0",
      "--admin_listen=127.0.0.1:0",
      absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
      "--log_level=warn"};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Joins the cgroup before exec, so that all of knnd is charged there.
    // Only async-signal-safe calls between fork and exec.
    const int fd = open(procs.c_str(), O_WRONLY);
    if (fd < 0 || write(fd, "0", 1) != 1) _exit(126);
    close(fd);
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::vector<Sample> samples;
  for (absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    absl::StatusOr<std::string> body = HttpGet(metrics_port, "/metrics");
    if (!body.ok()) continue;
    samples = ParseExposition(*body);
    if (FindSample(samples, "knnd_index_vectors").value_or(0) > 0) break;
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  return samples;
}

TEST(CgroupMetrics, DaemonReportsItsCgroupLimitOnlyWhenThereIsOne) {
  TestCgroup cgroup;
  if (!cgroup.ok()) {
    GTEST_SKIP() << "needs root and a writable memory cgroup controller";
  }
  TempDir tmp;
  WriteIndex(tmp.path("c.index"), IndexSpec{});

  std::vector<Sample> m = ScrapeDaemonIn(cgroup, tmp.path("c.index"));
  ASSERT_TRUE(FindSample(m, "knnd_index_vectors").has_value())
      << "knnd did not serve";
  EXPECT_GT(FindSample(m, "knnd_cgroup_memory_usage_bytes").value_or(0), 0);
  // A new cgroup under the root has no limit, unless the root itself has
  // one (a container's namespaced view).
  const absl::optional<std::string> root_limit = ReadKernelFile(
      cgroup.dir().substr(0, cgroup.dir().rfind('/')) + "/memory.limit_in_bytes");
  if (!root_limit || *root_limit == "9223372036854771712\n") {
    EXPECT_FALSE(FindSample(m, "knnd_cgroup_memory_limit_bytes").has_value());
  }

  ASSERT_TRUE(cgroup.SetLimit(kLimitBytes));
  m = ScrapeDaemonIn(cgroup, tmp.path("c.index"));
  EXPECT_EQ(FindSample(m, "knnd_cgroup_memory_limit_bytes"), kLimitBytes);
  const double usage =
      FindSample(m, "knnd_cgroup_memory_usage_bytes").value_or(0);
  EXPECT_GT(usage, 0);
  EXPECT_LE(usage, kLimitBytes);
  EXPECT_GT(FindSample(m, "knnd_cgroup_memory_anonymous_bytes").value_or(0), 0);
}

}  // namespace
}  // namespace knnd
