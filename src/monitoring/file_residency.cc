#include "knnd/monitoring/file_residency.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "knnd/monitoring/kernel_files.h"

namespace knnd {
namespace {

// Unit of mincore work and of the per-chunk cache: 4096 pages of 4 KiB.
constexpr uintptr_t kChunkBytes = uintptr_t{16} << 20;

size_t NumChunks(uintptr_t start, uintptr_t end) {
  return (end - start + kChunkBytes - 1) / kChunkBytes;
}

// One line of /proc/self/maps: "start-end perms offset dev inode   path";
// the path may contain blanks, so it is whatever follows the fifth field.
bool ParseMapsLine(absl::string_view line, uintptr_t* start, uintptr_t* end,
                   absl::string_view* path) {
  std::vector<absl::string_view> f =
      absl::StrSplit(line, absl::MaxSplits(' ', 5));
  if (f.size() != 6) return false;
  std::pair<absl::string_view, absl::string_view> range =
      absl::StrSplit(f[0], absl::MaxSplits('-', 1));
  uint64_t s = 0, e = 0;
  if (!absl::SimpleHexAtoi(range.first, &s) ||
      !absl::SimpleHexAtoi(range.second, &e) || e <= s) {
    return false;
  }
  *start = static_cast<uintptr_t>(s);
  *end = static_cast<uintptr_t>(e);
  *path = absl::StripLeadingAsciiWhitespace(f[5]);
  return true;
}

}  // namespace

absl::Status FileResidency::Track(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    absl::MutexLock lock(&mu_);
    path_.reset();  // never report a previous file as this one
    mappings_.clear();
    return absl::NotFoundError(absl::StrCat("cannot resolve ", path,
                                            " to follow its residency: ",
                                            strerror(errno)));
  }
  absl::MutexLock lock(&mu_);
  path_ = std::string(resolved);
  mappings_.clear();
  next_chunk_ = 0;
  return absl::OkStatus();
}

std::vector<FileResidency::Mapping> FileResidency::ReadMappings(
    const std::string& path) const {
  std::vector<Mapping> found;
  absl::optional<std::string> maps =
      ReadKernelFile(options_.proc_root + "/self/maps");
  if (!maps) return found;
  for (absl::string_view line : absl::StrSplit(*maps, '\n')) {
    Mapping m;
    absl::string_view mapped_path;
    if (!ParseMapsLine(line, &m.start, &m.end, &mapped_path) ||
        mapped_path != path) {
      continue;
    }
    m.chunk_resident_pages.assign(NumChunks(m.start, m.end), -1);
    found.push_back(std::move(m));
  }
  return found;
}

void FileResidency::Scan(Mapping* mapping, size_t chunk) const {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = mapping->start + chunk * kChunkBytes;
  const uintptr_t length = std::min(kChunkBytes, mapping->end - begin);
  std::vector<unsigned char> pages((length + page - 1) / page);
  // mincore only reads page tables and the page cache; it never faults a
  // page in. ENOMEM means the range was unmapped since maps was read (the
  // snapshot was released): keep the last count, the next sample drops it.
  if (mincore(reinterpret_cast<void*>(begin), length, pages.data()) != 0) {
    return;
  }
  mapping->chunk_resident_pages[chunk] =
      std::count_if(pages.begin(), pages.end(),
                    [](unsigned char p) { return (p & 1) != 0; });
}

absl::optional<FileResidency::Sample> FileResidency::Take() {
  absl::optional<std::string> path;
  {
    absl::MutexLock lock(&mu_);
    path = path_;
  }
  if (!path) return absl::nullopt;
  std::vector<Mapping> fresh = ReadMappings(*path);

  absl::MutexLock lock(&mu_);
  if (path_ != path) return absl::nullopt;  // Track() ran meanwhile
  auto same_range = [](const Mapping& a, const Mapping& b) {
    return a.start == b.start && a.end == b.end;
  };
  if (!std::equal(fresh.begin(), fresh.end(), mappings_.begin(),
                  mappings_.end(), same_range)) {
    mappings_ = std::move(fresh);
    next_chunk_ = 0;
  }
  size_t total_chunks = 0;
  for (const Mapping& m : mappings_) total_chunks += m.chunk_resident_pages.size();
  const size_t budget = static_cast<size_t>(std::max<int64_t>(
      1, options_.max_scan_bytes_per_sample / static_cast<int64_t>(kChunkBytes)));
  for (size_t n = 0; n < std::min(budget, total_chunks); ++n) {
    size_t chunk = next_chunk_ % total_chunks;
    for (Mapping& m : mappings_) {
      if (chunk < m.chunk_resident_pages.size()) {
        Scan(&m, chunk);
        break;
      }
      chunk -= m.chunk_resident_pages.size();
    }
    next_chunk_ = (next_chunk_ + 1) % total_chunks;
  }

  Sample sample;
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (const Mapping& m : mappings_) {
    sample.mapped_bytes += static_cast<int64_t>(m.end - m.start);
    for (int64_t pages : m.chunk_resident_pages) {
      if (pages > 0) sample.resident_bytes += pages * page;
    }
  }
  return sample;
}

}  // namespace knnd
