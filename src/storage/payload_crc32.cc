#include "knnd/storage/payload_crc32.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace knnd {

unsigned long InitialCrc32() { return crc32(0L, Z_NULL, 0); }

// zlib's crc32 takes uInt lengths: hence the pieces.
absl::optional<unsigned long> ExtendCrc32(unsigned long crc, const void* data,
                                          size_t bytes,
                                          const std::atomic<bool>* cancel) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::nullopt;
    }
    const size_t n = std::min<size_t>(bytes, size_t{64} << 20);
    crc = crc32(crc, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return crc;
}

absl::Status VerifyPayloadCrc32(const std::string& what, const void* data,
                                size_t bytes, uint32_t recorded,
                                const std::atomic<bool>* cancel) {
  const absl::optional<unsigned long> crc =
      ExtendCrc32(InitialCrc32(), data, bytes, cancel);
  if (!crc.has_value()) {
    return absl::CancelledError(
        absl::StrCat("the checksum of ", what, " was cancelled"));
  }
  if (static_cast<uint32_t>(*crc) != recorded) {
    return absl::DataLossError(absl::StrFormat(
        "%s is corrupt: payload CRC-32 is %08x but the header records %08x",
        what, static_cast<uint32_t>(*crc), recorded));
  }
  return absl::OkStatus();
}

}  // namespace knnd
