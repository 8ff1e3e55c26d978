#include "knnd/storage/index_metadata.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "knnd/storage/atomic_file.h"

namespace knnd {

std::string MetadataPath(const std::string& index_path) {
  return index_path + ".meta.json";
}

absl::StatusOr<std::string> FileCrc32(const std::string& path,
                                      const std::atomic<bool>* cancel) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  // A small file (a sidecar) reads through a small buffer: a 1 MiB one
  // per call would stay in the heap's arenas after every version load.
  struct stat st;
  const size_t size = fstat(fileno(file), &st) == 0
                          ? static_cast<size_t>(std::max<off_t>(st.st_size, 1))
                          : size_t{1} << 20;
  std::vector<unsigned char> buf(std::min(size, size_t{1} << 20));
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), file)) > 0) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      std::fclose(file);
      return absl::CancelledError(
          absl::StrCat("the checksum of ", path, " was cancelled"));
    }
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
  }
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return absl::DataLossError(absl::StrCat("error reading ", path));
  return absl::StrFormat("%08x", crc);
}

absl::Status WriteJsonFile(const std::string& path,
                           const google::protobuf::Message& message,
                           absl::string_view what) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (auto s =
          google::protobuf::util::MessageToJsonString(message, &json, options);
      !s.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot encode ", what, ": ", s.ToString()));
  }
  return WriteFileAtomically(path, json);
}

absl::Status ReadJsonFile(const std::string& path, absl::string_view what,
                          google::protobuf::Message* message) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  // Fields this knnd does not know are a newer knnctl's additions (a
  // change an older reader must not accept raises format_version instead):
  // skipped, so that a knnd rolled back still serves the versions written
  // since.
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (auto s = google::protobuf::util::JsonStringToMessage(text.str(), message,
                                                           options);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, " is not valid: ", s.message().ToString()));
  }
  return absl::OkStatus();
}

absl::Status WriteIndexMetadata(const std::string& path,
                                const knnd::v1::IndexMetadata& metadata) {
  return WriteJsonFile(path, metadata, "index metadata");
}

absl::StatusOr<knnd::v1::IndexMetadata> ReadIndexMetadata(
    const std::string& path) {
  knnd::v1::IndexMetadata metadata;
  if (absl::Status s = ReadJsonFile(path, "index metadata", &metadata);
      !s.ok()) {
    return s;
  }
  if (metadata.format_version() > kIndexMetadataFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index metadata ", path, " has format_version ",
        metadata.format_version(), "; this knnd reads up to ",
        kIndexMetadataFormatVersion));
  }
  return metadata;
}

absl::Status VerifyIndexChecksum(const std::string& index_path,
                                 const knnd::v1::IndexMetadata& metadata,
                                 const std::atomic<bool>* cancel) {
  struct stat st;
  if (stat(index_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "cannot stat index file ", index_path, ": ", std::strerror(errno)));
  }
  const std::string sidecar = MetadataPath(index_path);
  if (st.st_size != metadata.file_bytes()) {
    return absl::DataLossError(absl::StrCat(
        "index file ", index_path, " has ", st.st_size, " bytes but ", sidecar,
        " records ", metadata.file_bytes(),
        "; the file was changed after it was built"));
  }
  absl::StatusOr<std::string> crc = FileCrc32(index_path, cancel);
  if (!crc.ok()) return crc.status();
  if (*crc != metadata.crc32()) {
    return absl::DataLossError(absl::StrCat(
        "index file ", index_path, " has CRC-32 ", *crc, " but ", sidecar,
        " records ", metadata.crc32(),
        "; the file was changed after it was built"));
  }
  return absl::OkStatus();
}

}  // namespace knnd
