#include "knnd/monitoring/cgroup_memory.h"

#include <sys/stat.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "knnd/monitoring/kernel_files.h"

namespace knnd {
namespace {

// cgroup v1 writes "no limit" as INT64_MAX rounded down to a page
// (9223372036854771712 with 4 KiB pages); anything this large is no limit.
constexpr int64_t kUnlimitedAbove = int64_t{1} << 62;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A number, or nullopt for "max" (v2's "no limit"), a v1 "no limit" value,
// or anything unreadable.
absl::optional<int64_t> ReadLimit(const std::string& path) {
  absl::optional<std::string> text = ReadKernelFile(path);
  int64_t value = 0;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) ||
      value >= kUnlimitedAbove) {
    return absl::nullopt;
  }
  return value;
}

absl::optional<int64_t> ReadNumber(const std::string& path) {
  absl::optional<std::string> text = ReadKernelFile(path);
  int64_t value = 0;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) {
    return absl::nullopt;
  }
  return value;
}

absl::optional<int64_t> Min(absl::optional<int64_t> a,
                            absl::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The process's path in the v1 memory hierarchy or the v2 unified one, from
// /proc/self/cgroup lines "id:controllers:path".
struct CgroupPaths {
  absl::optional<std::string> v1_memory;
  absl::optional<std::string> v2;
};

CgroupPaths ParseProcCgroup(const std::string& content) {
  CgroupPaths paths;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      paths.v2 = fields[2];
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") paths.v1_memory = fields[2];
    }
  }
  return paths;
}

// The cgroup directory under `mount`: the process's own path joined under
// the mount when it exists there, else the mount itself (a container without
// a cgroup namespace sees the host's path but has its own cgroup mounted).
absl::optional<std::string> FindDir(const std::string& mount,
                                    const std::string& path,
                                    const char* probe_file) {
  const std::string joined = path == "/" ? mount : absl::StrCat(mount, path);
  if (Exists(absl::StrCat(joined, "/", probe_file))) return joined;
  if (Exists(absl::StrCat(mount, "/", probe_file))) return mount;
  return absl::nullopt;
}

CgroupMemory ReadV1(const std::string& dir) {
  CgroupMemory m;
  m.version = 1;
  m.dir = dir;
  m.usage_bytes = ReadNumber(dir + "/memory.usage_in_bytes");
  m.limit_bytes = ReadLimit(dir + "/memory.limit_in_bytes");
  if (absl::optional<std::string> stat = ReadKernelFile(dir + "/memory.stat")) {
    // A parent's limit binds too; v1 reports the tightest one here.
    absl::optional<int64_t> hierarchical =
        FindKeyedNumber(*stat, "hierarchical_memory_limit");
    if (hierarchical && *hierarchical >= kUnlimitedAbove) {
      hierarchical = absl::nullopt;
    }
    m.limit_bytes = Min(m.limit_bytes, hierarchical);
    // total_* include child cgroups, as usage_in_bytes does.
    m.anonymous_bytes = FindKeyedNumber(*stat, "total_rss");
    if (!m.anonymous_bytes) m.anonymous_bytes = FindKeyedNumber(*stat, "rss");
    m.file_bytes = FindKeyedNumber(*stat, "total_cache");
    if (!m.file_bytes) m.file_bytes = FindKeyedNumber(*stat, "cache");
  }
  return m;
}

CgroupMemory ReadV2(const std::string& mount, const std::string& dir) {
  CgroupMemory m;
  m.version = 2;
  m.dir = dir;
  m.usage_bytes = ReadNumber(dir + "/memory.current");
  // v2 does not fold a parent's memory.max into the child's: walk up to the
  // mount point and keep the tightest.
  for (std::string d = dir;;) {
    m.limit_bytes = Min(m.limit_bytes, ReadLimit(d + "/memory.max"));
    if (d.size() <= mount.size()) break;
    d = d.substr(0, d.rfind('/'));
  }
  if (absl::optional<std::string> stat = ReadKernelFile(dir + "/memory.stat")) {
    m.anonymous_bytes = FindKeyedNumber(*stat, "anon");
    m.file_bytes = FindKeyedNumber(*stat, "file");
  }
  return m;
}

}  // namespace

absl::optional<CgroupMemory> ReadCgroupMemory(const std::string& proc_root,
                                              const std::string& cgroup_root) {
  absl::optional<std::string> content =
      ReadKernelFile(proc_root + "/self/cgroup");
  if (!content) return absl::nullopt;
  const CgroupPaths paths = ParseProcCgroup(*content);
  // A memory controller on v1 cannot also be on v2, so v1 wins on hybrid
  // hosts (where the unified hierarchy has no memory files).
  if (paths.v1_memory) {
    const std::string mount = cgroup_root + "/memory";
    if (absl::optional<std::string> dir =
            FindDir(mount, *paths.v1_memory, "memory.usage_in_bytes")) {
      return ReadV1(*dir);
    }
  }
  if (paths.v2) {
    if (absl::optional<std::string> dir =
            FindDir(cgroup_root, *paths.v2, "memory.current")) {
      return ReadV2(cgroup_root, *dir);
    }
  }
  return absl::nullopt;
}

}  // namespace knnd
