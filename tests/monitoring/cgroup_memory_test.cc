// ReadCgroupMemory on fixture /proc and cgroup trees (v1, v2, hybrid)
// written into a temporary directory.
#include "knnd/monitoring/cgroup_memory.h"

#include <string>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;

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

}  // namespace
}  // namespace knnd
