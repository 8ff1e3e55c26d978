// SHA-256 of a whole file, as a bucket manifest lists it
// (proto/knnd/v1/bucket_manifest.proto): what a pod's sync recomputes with
// Python's hashlib before it hands a fetched version to knnd. OpenSSL's
// libcrypto computes it; the file is read in blocks, never held whole.
//
// Thread-safety: a pure function over a file.
#ifndef KNND_STORAGE_FILE_SHA256_H_
#define KNND_STORAGE_FILE_SHA256_H_

#include <string>

#include "absl/status/statusor.h"

namespace knnd {

// 64 lowercase hex digits; NOT_FOUND when `path` cannot be opened,
// DATA_LOSS naming it when a read fails.
absl::StatusOr<std::string> FileSha256(const std::string& path);

}  // namespace knnd

#endif  // KNND_STORAGE_FILE_SHA256_H_
