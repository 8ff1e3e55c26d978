#include "knnd/monitoring/process_stats.h"

#include <dirent.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "knnd/monitoring/kernel_files.h"

namespace knnd {
namespace {

// /proc/self/stat: "pid (comm) state ppid ...". comm may hold blanks and
// parentheses, so fields are counted from the last ')'. Indexes below are
// into the fields after it: field N of proc(5) is index N - 3.
constexpr size_t kUtime = 14 - 3;
constexpr size_t kStime = 15 - 3;
constexpr size_t kStartTime = 22 - 3;
constexpr size_t kVsize = 23 - 3;
constexpr size_t kRss = 24 - 3;

// The fields of a stat line after its comm (empty when it has none).
std::vector<absl::string_view> StatFields(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {};
  return absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ',
                        absl::SkipEmpty());
}

void ParseStat(const std::string& stat, absl::optional<int64_t> boot_time,
               ProcessStats* out) {
  std::vector<absl::string_view> f = StatFields(stat);
  if (f.size() <= kRss) return;
  int64_t utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
  if (!absl::SimpleAtoi(f[kUtime], &utime) ||
      !absl::SimpleAtoi(f[kStime], &stime) ||
      !absl::SimpleAtoi(f[kStartTime], &start) ||
      !absl::SimpleAtoi(f[kVsize], &vsize) ||
      !absl::SimpleAtoi(f[kRss], &rss)) {
    return;
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  out->cpu_seconds = static_cast<double>(utime + stime) / ticks;
  if (boot_time) {
    out->start_time_seconds = static_cast<double>(*boot_time) + start / ticks;
  }
  out->virtual_bytes = vsize;
  out->resident_bytes = rss * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// "Max open files            1048576              1048576              files"
absl::optional<int64_t> ParseMaxOpenFiles(const std::string& limits) {
  constexpr absl::string_view kName = "Max open files";
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (!absl::ConsumePrefix(&line, kName)) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t soft = 0;
    if (words.empty() || !absl::SimpleAtoi(words[0], &soft)) {
      return absl::nullopt;  // "unlimited"
    }
    return soft;
  }
  return absl::nullopt;
}

absl::optional<int64_t> CountEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::nullopt;
  int64_t n = 0;
  while (const dirent* entry = readdir(d)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(d);
  // Like Prometheus' Go collector, the count includes the descriptor that
  // opendir held while counting.
  return n;
}

}  // namespace

std::map<std::string, double> ThreadCpuSecondsByName(
    const std::string& proc_root, int pid) {
  std::map<std::string, double> by_name;
  const std::string tasks = proc_root + "/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return by_name;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  while (const dirent* entry = readdir(d)) {
    if (entry->d_name[0] == '.') continue;
    absl::optional<std::string> stat =
        ReadKernelFile(tasks + "/" + entry->d_name + "/stat");
    if (!stat) continue;  // the thread ended meanwhile
    const size_t open = stat->find('(');
    const size_t close = stat->rfind(')');
    std::vector<absl::string_view> f = StatFields(*stat);
    int64_t utime = 0, stime = 0;
    if (open == std::string::npos || f.size() <= kStime ||
        !absl::SimpleAtoi(f[kUtime], &utime) ||
        !absl::SimpleAtoi(f[kStime], &stime)) {
      continue;
    }
    by_name[stat->substr(open + 1, close - open - 1)] +=
        static_cast<double>(utime + stime) / ticks;
  }
  closedir(d);
  return by_name;
}

ProcessStats ReadProcessStats(const std::string& proc_root) {
  ProcessStats out;
  const std::string self = proc_root + "/self";
  absl::optional<int64_t> boot_time;
  if (absl::optional<std::string> stat = ReadKernelFile(proc_root + "/stat")) {
    boot_time = FindKeyedNumber(*stat, "btime");
  }
  if (absl::optional<std::string> stat = ReadKernelFile(self + "/stat")) {
    ParseStat(*stat, boot_time, &out);
  }
  if (absl::optional<std::string> status = ReadKernelFile(self + "/status")) {
    out.resident_anonymous_bytes = FindKeyedNumber(*status, "RssAnon");
    out.resident_file_bytes = FindKeyedNumber(*status, "RssFile");
    out.resident_shmem_bytes = FindKeyedNumber(*status, "RssShmem");
    out.peak_resident_bytes = FindKeyedNumber(*status, "VmHWM");
  }
  if (absl::optional<std::string> limits = ReadKernelFile(self + "/limits")) {
    out.max_fds = ParseMaxOpenFiles(*limits);
  }
  out.open_fds = CountEntries(self + "/fd");
  return out;
}

}  // namespace knnd
