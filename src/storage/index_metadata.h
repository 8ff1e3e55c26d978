// The metadata sidecar of an index file (INDEX + ".meta.json", schema in
// proto/knnd/v1/index_metadata.proto): written by `knnctl build`, read by
// IndexSnapshot::Load when present. It carries what the FAISS file cannot say
// (the vectors were L2-normalised, the source, the creation time) and a
// checksum that catches an index file changed after it was built.
//
// Thread-safety: pure functions; files are written to a temporary name and
// renamed into place, so a reader never sees half a sidecar.
#ifndef KNND_STORAGE_INDEX_METADATA_H_
#define KNND_STORAGE_INDEX_METADATA_H_

#include <atomic>
#include <string>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

// Sidecar format written by this build; a newer one is refused on read.
inline constexpr uint32_t kIndexMetadataFormatVersion = 1;

// index_path + ".meta.json".
std::string MetadataPath(const std::string& index_path);

// zlib's CRC-32 of the whole file as 8 lowercase hex digits, read in
// chunks of at most 1 MiB so that memory stays bounded whatever the file
// size. When `cancel` is given and turns true, the read stops with
// CANCELLED.
absl::StatusOr<std::string> FileCrc32(
    const std::string& path, const std::atomic<bool>* cancel = nullptr);

// The JSON files of a version (sidecar, manifest): `message` in protobuf's
// JSON mapping with the proto's field names, written through a temporary
// file and a rename; read with unknown fields skipped (a newer knnctl's
// additions). NOT_FOUND when `path` does not exist, INVALID_ARGUMENT
// naming `what` and `path` when it is not valid JSON of the schema.
absl::Status WriteJsonFile(const std::string& path,
                           const google::protobuf::Message& message,
                           absl::string_view what);
absl::Status ReadJsonFile(const std::string& path, absl::string_view what,
                          google::protobuf::Message* message);

// Writes `metadata` as JSON to `path` via a temporary file and a rename.
absl::Status WriteIndexMetadata(const std::string& path,
                                const knnd::v1::IndexMetadata& metadata);

// Reads a sidecar. NOT_FOUND when `path` does not exist (an index without a
// sidecar is served as it is); INVALID_ARGUMENT when it is not valid JSON of
// the schema or its format_version is newer than this build understands.
absl::StatusOr<knnd::v1::IndexMetadata> ReadIndexMetadata(
    const std::string& path);

// Checks that `index_path` has the size and CRC-32 the sidecar records;
// DATA_LOSS naming both values when it does not; CANCELLED when `cancel`
// turned true during the read.
absl::Status VerifyIndexChecksum(const std::string& index_path,
                                 const knnd::v1::IndexMetadata& metadata,
                                 const std::atomic<bool>* cancel = nullptr);

}  // namespace knnd

#endif  // KNND_STORAGE_INDEX_METADATA_H_
