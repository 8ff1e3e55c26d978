// Conversion from absl::Status (used inside knnd) to grpc::Status (on the
// wire). The two share canonical code numbers. Thread-safety: pure.
#ifndef KNND_RPC_STATUS_UTIL_H_
#define KNND_RPC_STATUS_UTIL_H_

#include <cstddef>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace knnd {

// The most bytes a status message may take on the wire. gRPC sends it in
// the grpc-message trailer, percent-encoded (a byte outside printable
// ASCII, or '%', takes three), and a client whose limit on received
// metadata (8 KiB by default in gRPC 1.51) the trailers exceed loses the
// whole status: it sees a metadata error instead of knnd's code. The shard
// front's message names every failed shard, up to 256 of them, so it can
// be longer; 4 KiB leaves room for the other trailers.
inline constexpr size_t kMaxStatusMessageWireBytes = 4096;

// `message` as it may go on the wire: unchanged when its encoded form fits
// kMaxStatusMessageWireBytes, else its head (the summary and the first
// failures come first in knnd's messages), cut at a character boundary,
// and " [... N more bytes cut]".
std::string BoundStatusMessage(absl::string_view message);

// The code, and the message through BoundStatusMessage.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace knnd

#endif  // KNND_RPC_STATUS_UTIL_H_
