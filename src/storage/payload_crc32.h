// CRC-32 (zlib's) of a mapped payload, the checksum the headers of knnd's
// own files record (vectors_file.h, id_table.h), computed in pieces so that
// a background verifier can be cancelled between them.
//
// Thread-safety: pure functions.
#ifndef KNND_STORAGE_PAYLOAD_CRC32_H_
#define KNND_STORAGE_PAYLOAD_CRC32_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/optional.h"

namespace knnd {

// The CRC-32 of no bytes: where a running checksum starts.
unsigned long InitialCrc32();

// `crc` extended over `bytes` bytes at `data`, in 64 MiB pieces, checking
// `cancel` (when given) between them; nullopt when it turned true.
absl::optional<unsigned long> ExtendCrc32(
    unsigned long crc, const void* data, size_t bytes,
    const std::atomic<bool>* cancel = nullptr);

// Checks the CRC-32 of `bytes` bytes at `data` against `recorded`, the
// value `what` (e.g. "vectors file PATH") records in its header: DATA_LOSS
// naming both values on a mismatch, CANCELLED when `cancel` turned true.
absl::Status VerifyPayloadCrc32(const std::string& what, const void* data,
                                size_t bytes, uint32_t recorded,
                                const std::atomic<bool>* cancel = nullptr);

}  // namespace knnd

#endif  // KNND_STORAGE_PAYLOAD_CRC32_H_
