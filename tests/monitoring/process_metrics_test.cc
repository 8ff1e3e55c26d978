// The /proc and cgroup readers behind ProcessMetrics, on fixture trees
// written into a temporary directory, plus a check against the real /proc.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "knnd/monitoring/cgroup_memory.h"
#include "knnd/monitoring/file_residency.h"
#include "knnd/monitoring/kernel_files.h"
#include "knnd/monitoring/process_stats.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using knnd::testing::TempDir;

void WriteFile(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream(path) << content;
}

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

TEST(FindKeyedNumber, MatchesWholeKeysAndConvertsKilobytes) {
  const std::string stat = "rss_huge 7\nrss 4096\ntotal_rss 8192\n";
  EXPECT_EQ(FindKeyedNumber(stat, "rss"), 4096);
  EXPECT_EQ(FindKeyedNumber(stat, "total_rss"), 8192);
  EXPECT_EQ(FindKeyedNumber(stat, "cache"), absl::nullopt);
  EXPECT_EQ(FindKeyedNumber("VmRSS:\t  12 kB\n", "VmRSS"), 12 * 1024);
  EXPECT_EQ(FindKeyedNumber("anon max\n", "anon"), absl::nullopt);
}

// ---- cgroups ----

constexpr char kV1Stat[] =
    "cache 100\nrss 200\nrss_huge 0\nhierarchical_memory_limit "
    "9223372036854771712\ntotal_cache 1000\ntotal_rss 2000\n";

TEST(ReadCgroupMemory, ReadsV1MemoryController) {
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"),
            "5:cpu,cpuacct:/pod\n4:memory:/kubepods/pod1\n0::/\n");
  const std::string cg = dir.path("cg/memory/kubepods/pod1");
  WriteFile(cg + "/memory.limit_in_bytes", "536870912\n");
  WriteFile(cg + "/memory.usage_in_bytes", "4000\n");
  WriteFile(cg + "/memory.stat", kV1Stat);

  absl::optional<CgroupMemory> m =
      ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->dir, cg);
  EXPECT_EQ(m->limit_bytes, 536870912);
  EXPECT_EQ(m->usage_bytes, 4000);
  EXPECT_EQ(m->anonymous_bytes, 2000);  // total_*: children included
  EXPECT_EQ(m->file_bytes, 1000);
}

TEST(ReadCgroupMemory, V1NoLimitIsAbsentAndParentLimitBinds) {
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"), "4:memory:/\n");
  const std::string cg = dir.path("cg/memory");
  WriteFile(cg + "/memory.limit_in_bytes", "9223372036854771712\n");
  WriteFile(cg + "/memory.usage_in_bytes", "4000\n");
  WriteFile(cg + "/memory.stat", kV1Stat);
  absl::optional<CgroupMemory> m =
      ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->limit_bytes, absl::nullopt);

  WriteFile(cg + "/memory.stat",
            "hierarchical_memory_limit 1073741824\ntotal_rss 5\n");
  m = ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->limit_bytes, 1073741824);
  EXPECT_EQ(m->anonymous_bytes, 5);
  EXPECT_EQ(m->file_bytes, absl::nullopt);
}

TEST(ReadCgroupMemory, V1HostPathNotMountedFallsBackToMountRoot) {
  // A container without a cgroup namespace: /proc/self/cgroup shows the
  // host's path, but the container's own cgroup is what is mounted.
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"), "4:memory:/docker/abc\n");
  WriteFile(dir.path("cg/memory/memory.limit_in_bytes"), "2147483648\n");
  WriteFile(dir.path("cg/memory/memory.usage_in_bytes"), "7\n");
  absl::optional<CgroupMemory> m =
      ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->dir, dir.path("cg/memory"));
  EXPECT_EQ(m->limit_bytes, 2147483648);
  EXPECT_EQ(m->usage_bytes, 7);
  // No memory.stat: the split is unknown, not zero.
  EXPECT_EQ(m->anonymous_bytes, absl::nullopt);
  EXPECT_EQ(m->file_bytes, absl::nullopt);
}

TEST(ReadCgroupMemory, ReadsV2WithTightestAncestorLimit) {
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"), "0::/kubepods/pod1/knnd\n");
  const std::string root = dir.path("cg");
  WriteFile(root + "/kubepods/memory.max", "max\n");
  WriteFile(root + "/kubepods/pod1/memory.max", "1073741824\n");
  WriteFile(root + "/kubepods/pod1/knnd/memory.max", "max\n");
  WriteFile(root + "/kubepods/pod1/knnd/memory.current", "123456\n");
  WriteFile(root + "/kubepods/pod1/knnd/memory.stat",
            "anon 100000\nfile 20000\nanon_thp 0\nfile_mapped 5\n");

  absl::optional<CgroupMemory> m = ReadCgroupMemory(dir.path("proc"), root);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, 2);
  EXPECT_EQ(m->limit_bytes, 1073741824);
  EXPECT_EQ(m->usage_bytes, 123456);
  EXPECT_EQ(m->anonymous_bytes, 100000);
  EXPECT_EQ(m->file_bytes, 20000);
}

TEST(ReadCgroupMemory, V2MaxIsAbsent) {
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"), "0::/\n");  // cgroup namespace
  WriteFile(dir.path("cg/memory.max"), "max\n");
  WriteFile(dir.path("cg/memory.current"), "42\n");
  absl::optional<CgroupMemory> m =
      ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, 2);
  EXPECT_EQ(m->limit_bytes, absl::nullopt);
  EXPECT_EQ(m->usage_bytes, 42);
}

TEST(ReadCgroupMemory, HybridHostUsesV1MemoryController) {
  // v2 mounted but without the memory controller, as on these CI hosts.
  TempDir dir;
  WriteFile(dir.path("proc/self/cgroup"), "4:memory:/job\n0::/\n");
  WriteFile(dir.path("cg/memory/job/memory.limit_in_bytes"), "4096\n");
  WriteFile(dir.path("cg/memory/job/memory.usage_in_bytes"), "1\n");
  WriteFile(dir.path("cg/unified/cgroup.procs"), "");
  absl::optional<CgroupMemory> m =
      ReadCgroupMemory(dir.path("proc"), dir.path("cg"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->limit_bytes, 4096);
}

TEST(ReadCgroupMemory, NoCgroupIsNullopt) {
  TempDir dir;
  EXPECT_FALSE(ReadCgroupMemory(dir.path("proc"), dir.path("cg")).has_value());
  WriteFile(dir.path("proc/self/cgroup"), "4:memory:/job\n0::/\n");
  EXPECT_FALSE(ReadCgroupMemory(dir.path("proc"), dir.path("cg")).has_value());
}

// ---- index file residency ----

TEST(FileResidency, ScansABoundedAmountPerTake) {
  TempDir dir;
  const std::string path = dir.path("index");
  constexpr size_t kBytes = size_t{40} << 20;  // 3 chunks of 16 MiB
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(1 << 20, 'x');
    for (size_t i = 0; i < kBytes / block.size(); ++i) {
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
  }
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);

  FileResidency::Options options;
  options.max_scan_bytes_per_sample = int64_t{16} << 20;
  FileResidency residency(options);
  EXPECT_FALSE(residency.Take().has_value());  // nothing tracked yet
  ASSERT_TRUE(residency.Track(path).ok());

  // Just written, so every page is in the page cache; one chunk is checked
  // per Take().
  absl::optional<FileResidency::Sample> s = residency.Take();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->mapped_bytes, static_cast<int64_t>(kBytes));
  EXPECT_EQ(s->resident_bytes, int64_t{16} << 20);
  s = residency.Take();
  EXPECT_EQ(s->resident_bytes, int64_t{32} << 20);
  s = residency.Take();
  EXPECT_EQ(s->resident_bytes, static_cast<int64_t>(kBytes));

  munmap(map, kBytes);
  s = residency.Take();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->mapped_bytes, 0);
  EXPECT_EQ(s->resident_bytes, 0);
}

TEST(FileResidency, TrackOfAMissingFileFails) {
  FileResidency residency(FileResidency::Options{});
  absl::Status s = residency.Track("/nonexistent/knnd.index");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/knnd.index"), std::string::npos);
}

}  // namespace
}  // namespace knnd
