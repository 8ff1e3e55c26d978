// IndexSource: where the versions of the served index come from.
//
// The index path names either one file, served as version 1, or a directory
// of numbered versions (TF Serving style):
//
//   <dir>/<N>/index.faiss                N: a positive decimal number
//   <dir>/<N>/index.faiss.meta.json      its sidecar (index_metadata.h)
//   <dir>/<N>/index.faiss.manifest.json  its manifest (version_manifest.h)
//   <dir>/<N>/index.faiss.ids ...        the companions the manifest binds
//
// A version is complete once its manifest exists, so a writer either fills
// <dir>/<N>.tmp/ and renames it to <dir>/<N>/ (PublishVersion, knnctl
// publish) or writes the manifest last. Incomplete versions and any other
// entries are ignored, never an error.
//
// Thread-safety: IndexSource is immutable and only reads the file system;
// its methods are safe to call concurrently.
#ifndef KNND_LIFECYCLE_INDEX_SOURCE_H_
#define KNND_LIFECYCLE_INDEX_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

// Name of the index file inside a version directory.
inline constexpr char kVersionIndexFile[] = "index.faiss";

struct IndexVersion {
  int64_t version = 0;
  std::string path;  // the index file
};

class IndexSource {
 public:
  explicit IndexSource(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // True when the path is a directory of versions (checked on each call, so
  // a path that does not exist yet counts as a file).
  bool IsDirectory() const;

  // The complete versions, lowest first. A file is {1, path} whether or not
  // it exists: loading it reports what is wrong with it.
  absl::StatusOr<std::vector<IndexVersion>> List() const;

  // The highest complete version; NOT_FOUND for a directory without one.
  absl::StatusOr<IndexVersion> Latest() const;

  // Complete version `version`; NOT_FOUND naming the versions there are.
  absl::StatusOr<IndexVersion> Find(int64_t version) const;

 private:
  std::string path_;
};

// Checks, before `index_file`'s version is copied or uploaded, that its
// index and sidecar agree with `manifest` (its manifest) and that every
// file it binds is there with the bound size; the error names the file.
absl::Status CheckVersionFilesPresent(
    const std::string& index_file, const knnd::v1::VersionManifest& manifest);

// Loads the version at `index_file` as knnd would, reading every file its
// `manifest` binds against its checksum (the raw vectors required when
// bound); the load's error, or OK.
absl::Status LoadToVerify(const std::string& index_file,
                          const knnd::v1::VersionManifest& manifest);

// Publishes the version at `index_file` as the next version of the
// versions directory `dir` (created if missing): the files its manifest
// binds and the manifest are copied into <dir>/<N>.tmp/, the copy is
// loaded and every file checked against its checksum, and the directory is
// renamed to <dir>/<N>/, N being one above the highest number in use. A
// bare FAISS file (no manifest, nothing beside it) gets a sidecar written
// from the loaded index and a manifest; files beside an index without a
// manifest are refused by name (FAILED_PRECONDITION). <N>.tmp directories
// of publishes killed on this host are removed first. A reader never sees
// a partial version.
absl::StatusOr<IndexVersion> PublishVersion(const std::string& dir,
                                            const std::string& index_file);

}  // namespace knnd

#endif  // KNND_LIFECYCLE_INDEX_SOURCE_H_
