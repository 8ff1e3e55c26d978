// ReadProcessStats on fixture /proc trees written into a temporary
// directory, plus a check against the real /proc.
#include "knnd/monitoring/process_stats.h"

#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;

// A real-looking stat line whose comm holds a blank and a ')'.
// Fields after comm: state=3 ... utime=14 stime=15 ... starttime=22
// vsize=23 rss=24.
constexpr char kStat[] =
    "4242 (knnd (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 "
    "250 150 0 0 20 0 7 0 5000 123456789 2048 18446744073709551615 "
    "1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";

constexpr char kStatus[] =
    "Name:\tknnd\nVmPeak:\t  200000 kB\nVmRSS:\t    8192 kB\n"
    "RssAnon:\t    5000 kB\nRssFile:\t    3000 kB\nRssShmem:\t     192 kB\n"
    "Threads:\t7\n";

constexpr char kLimits[] =
    "Limit                     Soft Limit           Hard Limit           Units\n"
    "Max cpu time              unlimited            unlimited            seconds\n"
    "Max open files            1024                 524288               files\n";

TEST(ReadProcessStats, ParsesStatStatusLimitsAndFds) {
  TempDir dir;
  const std::string proc = dir.path("proc");
  WriteFile(proc + "/stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n");
  WriteFile(proc + "/self/stat", kStat);
  WriteFile(proc + "/self/status", kStatus);
  WriteFile(proc + "/self/limits", kLimits);
  for (const char* fd : {"0", "1", "2", "7"}) {
    WriteFile(proc + "/self/fd/" + fd, "");
  }

  const ProcessStats s = ReadProcessStats(proc);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const int64_t page = sysconf(_SC_PAGESIZE);
  ASSERT_TRUE(s.cpu_seconds.has_value());
  EXPECT_DOUBLE_EQ(*s.cpu_seconds, 400 / ticks);
  ASSERT_TRUE(s.start_time_seconds.has_value());
  EXPECT_DOUBLE_EQ(*s.start_time_seconds, 1700000000 + 5000 / ticks);
  EXPECT_EQ(s.virtual_bytes, 123456789);
  EXPECT_EQ(s.resident_bytes, 2048 * page);
  EXPECT_EQ(s.resident_anonymous_bytes, 5000 * 1024);
  EXPECT_EQ(s.resident_file_bytes, 3000 * 1024);
  EXPECT_EQ(s.resident_shmem_bytes, 192 * 1024);
  EXPECT_EQ(s.open_fds, 4);
  EXPECT_EQ(s.max_fds, 1024);
}

// A thread's stat line: comm `name`, utime and stime ticks.
std::string ThreadStat(const std::string& name, int utime, int stime) {
  return "77 (" + name + ") S 1 77 77 0 -1 4194560 1000 0 0 0 " +
         std::to_string(utime) + " " + std::to_string(stime) +
         " 0 0 20 0 7 0 5000 123456789 2048\n";
}

TEST(ThreadCpuSecondsByName, SumsEachThreadNamesUserAndSystemTicks) {
  TempDir dir;
  const std::string proc = dir.path("proc");
  WriteFile(proc + "/77/task/77/stat", ThreadStat("knnd", 5, 1));
  WriteFile(proc + "/77/task/78/stat", ThreadStat("knnd-worker", 300, 20));
  WriteFile(proc + "/77/task/79/stat", ThreadStat("knnd-worker", 100, 0));
  WriteFile(proc + "/77/task/80/stat", ThreadStat("knnd (x) y", 7, 3));
  WriteFile(proc + "/77/task/81/stat", "81 (cut");  // malformed: skipped
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const std::map<std::string, double> cpu = ThreadCpuSecondsByName(proc, 77);
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_DOUBLE_EQ(cpu.at("knnd"), 6 / ticks);
  EXPECT_DOUBLE_EQ(cpu.at("knnd-worker"), 420 / ticks);
  EXPECT_DOUBLE_EQ(cpu.at("knnd (x) y"), 10 / ticks);
  EXPECT_TRUE(ThreadCpuSecondsByName(proc, 78).empty());  // no such process
}

TEST(ReadProcessStats, MissingFilesLeaveFieldsAbsent) {
  TempDir dir;
  WriteFile(dir.path("proc/self/stat"), kStat);  // no /proc/stat: no btime
  WriteFile(dir.path("proc/self/limits"),
            "Max open files            unlimited            unlimited    files\n");
  const ProcessStats s = ReadProcessStats(dir.path("proc"));
  EXPECT_TRUE(s.cpu_seconds.has_value());
  EXPECT_FALSE(s.start_time_seconds.has_value());
  EXPECT_FALSE(s.resident_anonymous_bytes.has_value());
  EXPECT_FALSE(s.resident_file_bytes.has_value());
  EXPECT_FALSE(s.open_fds.has_value());
  EXPECT_FALSE(s.max_fds.has_value());
}

TEST(ReadProcessStats, MalformedStatLeavesFieldsAbsent) {
  TempDir dir;
  WriteFile(dir.path("proc/self/stat"), "4242 (knnd) S 1 2 3\n");
  const ProcessStats s = ReadProcessStats(dir.path("proc"));
  EXPECT_FALSE(s.cpu_seconds.has_value());
  EXPECT_FALSE(s.resident_bytes.has_value());
}

TEST(ReadProcessStats, SplitAddsUpToResidentOnTheRealProc) {
  std::vector<char> heap(64 << 20, 1);  // some anonymous memory to count
  const ProcessStats s = ReadProcessStats("/proc");
  ASSERT_TRUE(s.resident_bytes && s.resident_anonymous_bytes &&
              s.resident_file_bytes && s.resident_shmem_bytes);
  const int64_t split = *s.resident_anonymous_bytes + *s.resident_file_bytes +
                        *s.resident_shmem_bytes;
  EXPECT_NEAR(static_cast<double>(split), static_cast<double>(*s.resident_bytes),
              0.05 * static_cast<double>(*s.resident_bytes));
  EXPECT_GE(*s.resident_anonymous_bytes, int64_t{64} << 20);
  EXPECT_GT(*s.open_fds, 2);
  EXPECT_GT(*s.start_time_seconds, 1.6e9);
  EXPECT_GT(heap[12345], 0);
}

}  // namespace
}  // namespace knnd
