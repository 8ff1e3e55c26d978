#include "remote_publish.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "command.h"
#include "knnd/index/index_sharding.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/file_sha256.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/v1/bucket_manifest.pb.h"
#include "rclone.h"

namespace knnd::knnctl {
namespace {

namespace fs = std::filesystem;
using knnd::v1::BucketManifest;

// Format of the bucket manifest written by this build.
constexpr uint32_t kBucketManifestFormatVersion = 1;

// One index of the version: the whole index, or one shard of a set.
struct Part {
  std::string index;  // the local index file
  std::string dir;    // its folder under PREFIX/<N>/: "" or "shard-S"
  knnd::v1::VersionManifest manifest;
  knnd::v1::IndexMetadata sidecar;
};

// The sealed, whole version at `index` (shard `shard` of `shards`, or one
// index for shards 0), loaded with every checksum read.
absl::StatusOr<Part> CheckPart(const std::string& index, int shard,
                               int shards) {
  Part part;
  part.index = index;
  part.dir = shards > 0 ? absl::StrCat("shard-", shard) : "";
  absl::StatusOr<knnd::v1::VersionManifest> manifest =
      ReadVersionManifest(index);
  if (absl::IsNotFound(manifest.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot publish ", index, " to a bucket: it has no manifest ",
        ManifestPath(index),
        " (knnctl build and update write one; knnctl seal binds files "
        "written before manifests)"));
  }
  if (!manifest.ok()) return manifest.status();
  part.manifest = *std::move(manifest);
  if (absl::Status s = CheckVersionFilesPresent(index, part.manifest);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = LoadToVerify(index, part.manifest); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("cannot publish ", index, ": ", s.message()));
  }
  absl::StatusOr<knnd::v1::IndexMetadata> sidecar =
      ReadIndexMetadata(MetadataPath(index));
  if (!sidecar.ok()) return sidecar.status();
  part.sidecar = *std::move(sidecar);
  const int count = static_cast<int>(part.sidecar.shard_count());
  if (shards == 0 && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        index, " is shard ", part.sidecar.shard_id(), " of ", count,
        ": publish the whole set with --index OUT --shards ", count));
  }
  if (shards > 0 &&
      (count != shards || static_cast<int>(part.sidecar.shard_id()) != shard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        index, " is ",
        count == 0
            ? std::string("not a shard")
            : absl::StrCat("shard ", part.sidecar.shard_id(), " of ", count),
        ", not shard ", shard, " of --shards ", shards));
  }
  return part;
}

absl::StatusOr<std::vector<Part>> CheckParts(
    const RemotePublishOptions& options) {
  std::vector<Part> parts;
  for (int s = 0; s < std::max(options.shards, 1); ++s) {
    absl::StatusOr<Part> part = CheckPart(
        options.shards > 0 ? ShardPath(options.index, s, options.shards)
                           : options.index,
        s, options.shards);
    if (!part.ok()) return part.status();
    if (!parts.empty() &&
        part->sidecar.build_id() != parts[0].sidecar.build_id()) {
      return absl::InvalidArgumentError(absl::StrCat(
          part->index, " is of build ", part->sidecar.build_id(), " but ",
          parts[0].index, " of build ", parts[0].sidecar.build_id(),
          ": a set's shards come from one split"));
    }
    parts.push_back(*std::move(part));
  }
  return parts;
}

// The suffixes of `part`'s files after the index file's name: those its
// manifest binds, and the manifest's own.
std::vector<std::string> SuffixesOf(const Part& part) {
  std::vector<std::string> suffixes;
  for (const auto& file : part.manifest.files()) {
    suffixes.push_back(file.suffix());
  }
  suffixes.push_back(".manifest.json");
  return suffixes;
}

// `dir`/`name`, or `name` for the top folder.
std::string Under(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : absl::StrCat(dir, "/", name);
}

// The bucket manifest of `parts` as version `version`: every bound file
// and every version manifest, each by size and SHA-256.
absl::StatusOr<BucketManifest> ManifestOf(const RemotePublishOptions& options,
                                          const std::vector<Part>& parts) {
  BucketManifest manifest;
  manifest.set_format_version(kBucketManifestFormatVersion);
  manifest.set_written_by("knnctl publish --remote");
  std::error_code ec;
  manifest.set_source(fs::absolute(options.index, ec).string());
  manifest.set_build_id(parts[0].sidecar.build_id());
  manifest.set_shard_count(static_cast<uint32_t>(options.shards));
  for (const Part& part : parts) {
    if (options.shards > 0) {
      BucketManifest::Shard* shard = manifest.add_shards();
      shard->set_shard_id(part.sidecar.shard_id());
      shard->set_dir(part.dir);
      shard->set_version_id(part.manifest.version_id());
    }
    for (const std::string& suffix : SuffixesOf(part)) {
      const std::string local = part.index + suffix;
      absl::StatusOr<std::string> sha256 = FileSha256(local);
      if (!sha256.ok()) return sha256.status();
      struct stat st;
      if (stat(local.c_str(), &st) != 0) {
        return absl::NotFoundError(absl::StrCat("cannot stat ", local));
      }
      BucketManifest::File* file = manifest.add_files();
      file->set_path(Under(part.dir, kVersionIndexFile + suffix));
      file->set_bytes(st.st_size);
      file->set_sha256(*sha256);
    }
  }
  return manifest;
}

// The highest version number in use under `remote` (complete or not: a
// number an upload began is never given again); 0 for none.
absl::StatusOr<int64_t> HighestRemoteVersion(const std::string& rclone,
                                             const std::string& remote) {
  absl::StatusOr<std::string> listing = RunRclone(
      rclone, {"lsf", "--dirs-only", remote}, absl::StrCat("list ", remote));
  if (absl::IsNotFound(listing.status())) return 0;
  if (!listing.ok()) return listing.status();
  int64_t highest = 0;
  for (absl::string_view line : absl::StrSplit(*listing, '\n')) {
    absl::string_view name = absl::StripSuffix(line, "/");
    int64_t n = 0;
    if (!name.empty() &&
        std::all_of(name.begin(), name.end(),
                    [](char c) { return absl::ascii_isdigit(c); }) &&
        absl::SimpleAtoi(name, &n)) {
      highest = std::max(highest, n);
    }
  }
  return highest;
}

// A temporary folder of links named as the version's files are in the
// bucket, to each local file: one `rclone copy` uploads them all, with
// rclone's parallel transfers. Removed with this object.
class UploadFolder {
 public:
  static absl::StatusOr<UploadFolder> Create(const std::vector<Part>& parts) {
    const char* tmp = std::getenv("TMPDIR");
    std::string path =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                     "/knnctl-publish-XXXXXX");
    if (mkdtemp(path.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot create a temporary folder ", path));
    }
    UploadFolder folder(path);
    for (const Part& part : parts) {
      std::error_code ec;
      fs::create_directories(Under(path, part.dir), ec);
      for (const std::string& suffix : SuffixesOf(part)) {
        const fs::path target = fs::absolute(part.index + suffix, ec);
        fs::create_symlink(
            target, Under(path, Under(part.dir, kVersionIndexFile + suffix)),
            ec);
        if (ec) {
          return absl::UnavailableError(absl::StrCat("cannot link ",
                                                     target.string(), " into ",
                                                     path, ": ", ec.message()));
        }
      }
    }
    return folder;
  }
  UploadFolder(UploadFolder&& other) noexcept : path_(std::move(other.path_)) {
    other.path_.clear();
  }
  ~UploadFolder() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit UploadFolder(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace

int PublishToRemote(const RemotePublishOptions& options) {
  const std::string remote(absl::StripSuffix(options.remote, "/"));
  if (remote.find(':') == std::string::npos) {
    return Fail(
        absl::StrCat("--remote ", options.remote,
                     " is not an rclone remote path REMOTE:bucket/prefix"));
  }
  absl::StatusOr<std::string> rclone = FindRclone();
  if (!rclone.ok()) return Fail(rclone.status());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<Part>> parts = CheckParts(options);
  if (!parts.ok()) return Fail(parts.status());
  absl::StatusOr<BucketManifest> manifest = ManifestOf(options, *parts);
  if (!manifest.ok()) return Fail(manifest.status());
  absl::StatusOr<int64_t> highest = HighestRemoteVersion(*rclone, remote);
  if (!highest.ok()) return Fail(highest.status());
  const int64_t version = *highest + 1;
  const std::string target = absl::StrCat(remote, "/", version);
  manifest->set_version(version);
  manifest->set_created(
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));

  absl::StatusOr<UploadFolder> folder = UploadFolder::Create(*parts);
  if (!folder.ok()) return Fail(folder.status());
  absl::StatusOr<std::string> copied =
      RunRclone(*rclone, {"copy", "--copy-links", folder->path(), target},
                absl::StrCat("upload version ", version, " to ", target));
  if (!copied.ok()) return Fail(copied.status());
  // Last: the version is complete once its bucket manifest is there.
  const std::string manifest_file =
      absl::StrCat(folder->path(), "/", kBucketManifestName);
  if (absl::Status s =
          WriteJsonFile(manifest_file, *manifest, "bucket manifest");
      !s.ok()) {
    return Fail(s);
  }
  copied = RunRclone(
      *rclone,
      {"copyto", manifest_file, absl::StrCat(target, "/", kBucketManifestName)},
      absl::StrCat("upload the bucket manifest of version ", version));
  if (!copied.ok()) return Fail(copied.status());

  int64_t bytes = 0;
  for (const auto& file : manifest->files()) bytes += file.bytes();
  std::printf("published: %s%s as version %lld of %s\n", options.index.c_str(),
              options.shards > 0
                  ? absl::StrCat(" (", options.shards, " shards)").c_str()
                  : "",
              static_cast<long long>(version), remote.c_str());
  std::printf("uploaded:  %d files, %lld bytes in %.1f s; %s/%s written last\n",
              manifest->files_size(), static_cast<long long>(bytes),
              absl::ToDoubleSeconds(absl::Now() - start), target.c_str(),
              kBucketManifestName);
  std::printf(
      "next:      pods' knnd_bucket_sync fetch it at their next poll; "
      "roll back by publishing an older build again (a new version)\n");
  return kExitOk;
}

}  // namespace knnd::knnctl
