#include "knnd/lifecycle/index_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;

// N for a directory entry named "N" (with `suffix` "") or "N.tmp"; 0 when
// the name is anything else.
int64_t VersionNumber(const std::string& name, absl::string_view suffix) {
  absl::string_view digits = name;
  if (!absl::ConsumeSuffix(&digits, suffix)) return 0;
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return absl::ascii_isdigit(c); })) {
    return 0;
  }
  int64_t n = 0;
  return absl::SimpleAtoi(digits, &n) ? n : 0;
}

std::string VersionIndexPath(const std::string& dir, int64_t version) {
  return absl::StrCat(dir, "/", version, "/", kVersionIndexFile);
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The highest N of "N" and "N.tmp" entries of `dir`, complete or not.
absl::StatusOr<int64_t> HighestNumberInUse(const std::string& dir) {
  std::error_code ec;
  int64_t highest = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    highest = std::max({highest, VersionNumber(name, ""),
                        VersionNumber(name, ".tmp")});
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot list versions directory ", dir, ": ",
                     ec.message()));
  }
  return highest;
}

// The sidecar of an index file that has none, from the loaded index.
absl::Status WriteSidecarFor(const std::string& index_file,
                             const std::string& sidecar) {
  LoadOptions options;
  options.use_precomputed_table = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(index_file, options);
  if (!loaded.ok()) return loaded.status();
  const IndexInfo& info = (*loaded)->info();
  absl::StatusOr<std::string> crc = FileCrc32(index_file);
  if (!crc.ok()) return crc.status();
  knnd::v1::IndexMetadata metadata;
  metadata.set_format_version(kIndexMetadataFormatVersion);
  metadata.set_dim(static_cast<uint32_t>(info.dim));
  metadata.set_metric(MetricName(info.metric));
  metadata.set_ntotal(info.ntotal);
  metadata.set_factory(info.index_type);
  metadata.set_source(index_file);
  metadata.set_created(absl::FormatTime(absl::RFC3339_sec, absl::Now(),
                                        absl::UTCTimeZone()));
  metadata.set_file_bytes(info.file_bytes);
  metadata.set_crc32(*crc);
  return WriteIndexMetadata(sidecar, metadata);
}

}  // namespace

bool IndexSource::IsDirectory() const {
  std::error_code ec;
  return fs::is_directory(path_, ec);
}

absl::StatusOr<std::vector<IndexVersion>> IndexSource::List() const {
  if (!IsDirectory()) return std::vector<IndexVersion>{{1, path_}};
  std::vector<IndexVersion> versions;
  std::error_code ec;
  for (fs::directory_iterator it(path_, ec), end; !ec && it != end;
       it.increment(ec)) {
    const int64_t n = VersionNumber(it->path().filename().string(), "");
    if (n <= 0) continue;
    const std::string index = VersionIndexPath(path_, n);
    if (Exists(MetadataPath(index))) versions.push_back({n, index});
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot list versions directory ", path_, ": ", ec.message()));
  }
  std::sort(versions.begin(), versions.end(),
            [](const IndexVersion& a, const IndexVersion& b) {
              return a.version < b.version;
            });
  return versions;
}

absl::StatusOr<IndexVersion> IndexSource::Latest() const {
  absl::StatusOr<std::vector<IndexVersion>> versions = List();
  if (!versions.ok()) return versions.status();
  if (versions->empty()) {
    return absl::NotFoundError(absl::StrCat(
        "versions directory ", path_, " holds no complete version (",
        path_, "/<N>/", kVersionIndexFile, " with its sidecar ",
        kVersionIndexFile, ".meta.json)"));
  }
  return versions->back();
}

absl::StatusOr<IndexVersion> IndexSource::Find(int64_t version) const {
  absl::StatusOr<std::vector<IndexVersion>> versions = List();
  if (!versions.ok()) return versions.status();
  std::vector<int64_t> numbers;
  for (const IndexVersion& v : *versions) {
    if (v.version == version) return v;
    numbers.push_back(v.version);
  }
  return absl::NotFoundError(absl::StrCat(
      "version ", version, " is not a complete version of ", path_,
      " (complete: ", numbers.empty() ? "none" : absl::StrJoin(numbers, ", "),
      ")"));
}

absl::StatusOr<IndexVersion> PublishVersion(const std::string& dir,
                                            const std::string& index_file) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create versions directory ", dir, ": ", ec.message()));
  }
  absl::StatusOr<int64_t> highest = HighestNumberInUse(dir);
  if (!highest.ok()) return highest.status();
  // mkdir is the claim on a number: a concurrent publisher that took it
  // first makes this one move on to the next.
  int64_t version = *highest + 1;
  std::string staging;
  for (;; ++version) {
    staging = absl::StrCat(dir, "/", version, ".tmp");
    if (mkdir(staging.c_str(), 0755) == 0) break;
    if (errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create ", staging, ": ", std::strerror(errno)));
    }
  }
  const std::string final_dir = absl::StrCat(dir, "/", version);
  absl::Status status = [&]() -> absl::Status {
    const std::string staged = absl::StrCat(staging, "/", kVersionIndexFile);
    std::error_code ec;
    fs::copy_file(index_file, staged, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "cannot copy ", index_file, " to ", staged, ": ", ec.message()));
    }
    // The raw vectors for re-ranking, the id table, the payloads and the
    // attribute store travel with their index, and must match it.
    const bool has_vectors = Exists(VectorsPath(index_file));
    for (const auto& companion :
         {VectorsPath, IdTablePath, PayloadPath, AttributeStorePath}) {
      const std::string file = companion(index_file);
      if (!Exists(file)) continue;
      fs::copy_file(file, companion(staged), ec);
      if (ec) {
        return absl::UnavailableError(
            absl::StrCat("cannot copy ", file, ": ", ec.message()));
      }
    }
    const std::string sidecar = MetadataPath(index_file);
    if (!Exists(sidecar)) return WriteSidecarFor(staged, MetadataPath(staged));
    fs::copy_file(sidecar, MetadataPath(staged), ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "cannot copy ", sidecar, ": ", ec.message()));
    }
    // The copy, checked against its sidecar, is what knnd will load.
    LoadOptions options;
    options.use_precomputed_table = false;
    if (has_vectors) options.vectors = VectorsPolicy::kRequired;
    return IndexSnapshot::Load(staged, options).status();
  }();
  if (status.ok()) {
    // Durable before it becomes visible: the copies, the staging directory,
    // then (after the rename) the versions directory.
    for (const fs::directory_entry& entry : fs::directory_iterator(staging, ec)) {
      if (status.ok()) status = SyncFile(entry.path().string());
    }
  }
  if (status.ok()) {
    SyncDirectoryOf(staging);
    fs::rename(staging, final_dir, ec);
    if (ec) {
      status = absl::UnavailableError(absl::StrCat(
          "cannot rename ", staging, " to ", final_dir, ": ", ec.message()));
    }
  }
  if (!status.ok()) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    return status;
  }
  SyncDirectoryOf(dir);
  return IndexVersion{version, VersionIndexPath(dir, version)};
}

}  // namespace knnd
