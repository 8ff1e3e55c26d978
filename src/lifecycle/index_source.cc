#include "knnd/lifecycle/index_source.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/version_manifest.h"

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

// The file a publisher leaves in its <N>.tmp directory while it fills it:
// "HOST PID", so that the next publish on the host can tell a directory
// of a publisher that was killed from one still being filled.
constexpr char kPublisherFile[] = ".publisher";

std::string PublisherName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, " ", getpid());
}

// Removes the <N>.tmp directories of `dir` whose publisher ran on this host
// and no longer runs (killed publishes), and those with no publisher file
// (written before it existed, or killed before writing it) once they are
// an hour old.
void RemoveStalePublishes(const std::string& dir) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (VersionNumber(it->path().filename().string(), ".tmp") <= 0) continue;
    std::ifstream in(it->path() / kPublisherFile);
    std::string publisher_host;
    int64_t pid = 0;
    if (in >> publisher_host >> pid) {
      if (publisher_host == host && pid > 0 && pid <= INT32_MAX &&
          kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        stale.push_back(it->path());
      }
      continue;
    }
    std::error_code time_ec;
    const auto written = fs::last_write_time(it->path(), time_ec);
    if (!time_ec &&
        fs::file_time_type::clock::now() - written > std::chrono::hours(1)) {
      stale.push_back(it->path());
    }
  }
  for (const fs::path& path : stale) {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
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
    if (Exists(ManifestPath(index))) versions.push_back({n, index});
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
        "versions directory ", path_, " holds no complete version (", path_,
        "/<N>/", kVersionIndexFile, " with its manifest ", kVersionIndexFile,
        ".manifest.json)"));
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

absl::Status CheckVersionFilesPresent(
    const std::string& index_file, const knnd::v1::VersionManifest& manifest) {
  if (absl::Status s = CheckIndexAndSidecar(index_file, manifest); !s.ok()) {
    return s;
  }
  for (const knnd::v1::VersionManifest::File& file : manifest.files()) {
    const std::string path = index_file + file.suffix();
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "cannot publish ", index_file, ": its ", file.role(), " file ", path,
          ", bound by ", ManifestPath(index_file), ", is missing"));
    }
    if (st.st_size != file.bytes()) {
      return absl::DataLossError(
          absl::StrCat("cannot publish ", index_file, ": ", path, " has ",
                       st.st_size, " bytes but ", ManifestPath(index_file),
                       " binds one of ", file.bytes()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadToVerify(const std::string& index_file,
                          const knnd::v1::VersionManifest& manifest) {
  LoadOptions options;
  options.use_precomputed_table = false;
  if (BoundFile(manifest, kRoleVectors) != nullptr) {
    options.vectors = VectorsPolicy::kRequired;
  }
  return IndexSnapshot::Load(index_file, options).status();
}

absl::StatusOr<IndexVersion> PublishVersion(const std::string& dir,
                                            const std::string& index_file) {
  // Only a whole version is published: the files its manifest binds, or a
  // bare FAISS file with nothing beside it. Files without a manifest (a
  // build or update that did not finish) are refused by name rather than
  // published as a version that answers without them.
  absl::StatusOr<knnd::v1::VersionManifest> manifest =
      ReadVersionManifest(index_file);
  if (!manifest.ok() && !absl::IsNotFound(manifest.status())) {
    return manifest.status();
  }
  if (manifest.ok()) {
    if (absl::Status s = CheckVersionFilesPresent(index_file, *manifest);
        !s.ok()) {
      return s;
    }
  } else if (const std::vector<std::string> present =
                 VersionFilesPresent(index_file);
             !present.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot publish ", index_file, ": ", absl::StrJoin(present, ", "),
        " beside it but no manifest ", ManifestPath(index_file),
        " binds them (a build or update that did not finish: run it again)"));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create versions directory ", dir, ": ", ec.message()));
  }
  RemoveStalePublishes(dir);
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
    if (absl::Status s = WriteFileAtomically(
            absl::StrCat(staging, "/", kPublisherFile), PublisherName());
        !s.ok()) {
      return s;
    }
    const std::string staged = absl::StrCat(staging, "/", kVersionIndexFile);
    std::error_code ec;
    auto copy = [&](const std::string& from, const std::string& to) {
      fs::copy_file(from, to, ec);
      return ec ? absl::UnavailableError(absl::StrCat(
                      "cannot copy ", from, " to ", to, ": ", ec.message()))
                : absl::OkStatus();
    };
    if (!manifest.ok()) {
      if (absl::Status s = copy(index_file, staged); !s.ok()) return s;
      if (absl::Status s = WriteSidecarFor(staged, MetadataPath(staged));
          !s.ok()) {
        return s;
      }
      return SealVersion(staged, "knnctl publish");
    }
    // The files the manifest binds, and the manifest last.
    for (const knnd::v1::VersionManifest::File& file : manifest->files()) {
      if (absl::Status s =
              copy(index_file + file.suffix(), staged + file.suffix());
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = copy(ManifestPath(index_file), ManifestPath(staged));
        !s.ok()) {
      return s;
    }
    // The copy, checked whole against its manifest, is what knnd will
    // load: every file's bytes against its checksum.
    return LoadToVerify(staged, *manifest);
  }();
  if (status.ok()) {
    std::remove(absl::StrCat(staging, "/", kPublisherFile).c_str());
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
