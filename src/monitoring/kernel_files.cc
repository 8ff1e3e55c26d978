#include "knnd/monitoring/kernel_files.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knnd {

absl::optional<std::string> ReadKernelFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::nullopt;
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) return absl::nullopt;
  return content.str();
}

absl::optional<int64_t> FindKeyedNumber(absl::string_view content,
                                        absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    if (!absl::ConsumePrefix(&line, key)) continue;
    // "key" must be the whole first word: "rss" must not match "rss_huge".
    if (line.empty() || (line[0] != ':' && !absl::ascii_isblank(line[0]))) {
      continue;
    }
    absl::ConsumePrefix(&line, ":");
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t value = 0;
    if (words.empty() || !absl::SimpleAtoi(words[0], &value)) {
      return absl::nullopt;
    }
    if (words.size() > 1 && words[1] == "kB") value *= 1024;
    return value;
  }
  return absl::nullopt;
}

}  // namespace knnd
