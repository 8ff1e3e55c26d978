// The manifest of a version (INDEX + ".manifest.json", schema in
// proto/knnd/v1/index_metadata.proto, VersionManifest): what binds an
// index file, its sidecar and its companions (id table, payloads,
// attribute store, raw vectors) into one version. leveldb's MANIFEST and
// TF Serving's version directories are the model: the files of a version
// are written first, under names no reader loads, and the version exists
// once its manifest is written, last.
//
// Writers (knnctl build, update, shard, convert, tune, publish) write a
// version's files under a staging name (StagingPathFor), seal it there
// (SealVersion) and commit it under its own name (CommitStagedVersion):
// a writer killed at any point before the commit leaves the version that
// was there untouched, and stale staging files are removed by the next
// run for the same output (RemoveStaleTemporaries). A kill inside the
// commit (a few renames) leaves no manifest, which knnd refuses.
//
// The loader (index/index_snapshot.cc) serves only files a manifest binds:
// each by size, the index and sidecar by the sidecar's CRC-32 and the
// companions by the content CRC-32 their headers record (checked at open,
// without reading the files; their bytes are checked against that CRC by
// the load's or the background's checksum pass).
//
// Thread-safety: pure functions over files; a staging name holds the pid,
// so two processes never write the same staging file.
#ifndef KNND_STORAGE_VERSION_MANIFEST_H_
#define KNND_STORAGE_VERSION_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

// Manifest format written by this build; a newer one is refused on read.
inline constexpr uint32_t kVersionManifestFormatVersion = 1;

// The files a version may hold, by role, and the suffix each adds to the
// index file's name.
inline constexpr char kRoleIndex[] = "index";
inline constexpr char kRoleSidecar[] = "sidecar";
inline constexpr char kRoleIds[] = "ids";
inline constexpr char kRolePayloads[] = "payloads";
inline constexpr char kRoleAttributes[] = "attributes";
inline constexpr char kRoleVectors[] = "vectors";
inline constexpr char kRoleText[] = "text";
struct VersionRole {
  const char* role;
  const char* suffix;
};
const std::vector<VersionRole>& VersionRoles();

// index_path + ".manifest.json".
std::string ManifestPath(const std::string& index_path);

// 16 hex digits, random and clock-mixed: a version's (or a build's) id.
std::string NewVersionId();

// Reads the manifest of the version at `index_path`. NOT_FOUND when it has
// none; INVALID_ARGUMENT when it is not valid JSON of the schema, is of a
// newer format, or binds a role twice or one this build does not know.
absl::StatusOr<knnd::v1::VersionManifest> ReadVersionManifest(
    const std::string& index_path);

// The entry of `role` in `manifest`, or null when it binds no such file.
const knnd::v1::VersionManifest::File* BoundFile(
    const knnd::v1::VersionManifest& manifest, absl::string_view role);

// Writes the manifest of the version at `index_path` from the files beside
// it: the index and its sidecar (which must exist and agree: the index's
// size and CRC-32 are the sidecar's), the id table, payloads, attribute
// store and text index (text/text_index.h, bound by its header: magic
// "KNNDTEXT", rows at byte 16, content CRC-32 at byte 28) the sidecar
// declares (each must exist and open with the sidecar's row count), and
// the raw-vectors file when one is there. Written through
// a temporary file and a rename; `written_by` names the tool.
absl::Status SealVersion(const std::string& index_path,
                         absl::string_view written_by);

// Replaces the sidecar of the sealed version at `index_path` with
// `metadata` (knnctl tune's record) and seals the version again. The
// version must be whole first (CheckIndexAndSidecar), so that a re-seal
// never binds files that were not the version's. A kill between the two
// writes leaves a sidecar the manifest does not bind: refused, not mixed.
absl::Status RewriteSidecar(const std::string& index_path,
                            const knnd::v1::IndexMetadata& metadata,
                            absl::string_view written_by);

// Checks the index file's size and the sidecar's bytes against
// `manifest`: DATA_LOSS naming the file, the manifest and both values when
// they differ (the sidecar's CRC-32 is read whole: it is small), and when
// the sidecar's record of the index differs from the manifest's.
absl::Status CheckIndexAndSidecar(const std::string& index_path,
                                  const knnd::v1::VersionManifest& manifest);

// Checks one opened companion of the version at `index_path` against
// `manifest`: FAILED_PRECONDITION when the manifest binds no file of
// `role`, DATA_LOSS naming the file and both values when its size or
// content CRC-32 is not the bound one (a file of another build).
absl::Status CheckBoundCompanion(const std::string& index_path,
                                 const knnd::v1::VersionManifest& manifest,
                                 absl::string_view role, int64_t bytes,
                                 uint32_t content_crc32);

// The files of a version (sidecar or companions) present beside
// `index_path`, by path: what an index without a manifest must not have.
std::vector<std::string> VersionFilesPresent(const std::string& index_path);

// `index_path` + ".tmp." + this process's pid: the name a writer builds
// the version under, its companions beside it (STAGED.ids ...).
std::string StagingPathFor(const std::string& index_path);

// Moves the sealed version at `staged` to `index_path`: removes
// `index_path`'s manifest, renames every file the staged manifest binds
// into place, removes `index_path`'s files of roles the new version does
// not have (appending their paths to `removed`), then renames the manifest
// into place. FAILED_PRECONDITION when `staged` has no manifest.
absl::Status CommitStagedVersion(const std::string& staged,
                                 const std::string& index_path,
                                 std::vector<std::string>* removed = nullptr);

// Removes every file of the staging version at `staged` (a failed run's).
void RemoveStagedVersion(const std::string& staged);

// Removes the temporary and staging files of `index_path` left by runs
// that were killed: names of the form INDEX[.suffix].tmp.PID[...] whose
// process no longer runs on this host. Returns the paths removed.
std::vector<std::string> RemoveStaleTemporaries(const std::string& index_path);

}  // namespace knnd

#endif  // KNND_STORAGE_VERSION_MANIFEST_H_
