#include "knnd/rpc/status_util.h"

#include "absl/strings/str_cat.h"

namespace knnd {
namespace {

// Bytes `c` takes in the percent-encoded grpc-message trailer.
size_t WireBytes(unsigned char c) {
  return c >= 0x20 && c <= 0x7e && c != '%' ? 1 : 3;
}

// A UTF-8 continuation byte: not where a character starts.
bool IsContinuation(unsigned char c) { return (c & 0xc0) == 0x80; }

}  // namespace

std::string BoundStatusMessage(absl::string_view message) {
  size_t wire = 0;
  for (unsigned char c : message) wire += WireBytes(c);
  if (wire <= kMaxStatusMessageWireBytes) return std::string(message);
  // The note's length depends on the count it prints: the longest count
  // is the whole message's.
  const size_t note_bytes =
      absl::StrCat(" [... ", message.size(), " more bytes cut]").size();
  size_t head = 0;
  for (wire = note_bytes; head < message.size(); ++head) {
    wire += WireBytes(message[head]);
    if (wire > kMaxStatusMessageWireBytes) break;
  }
  while (head > 0 && IsContinuation(message[head])) --head;
  return absl::StrCat(message.substr(0, head), " [... ", message.size() - head,
                      " more bytes cut]");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundStatusMessage(status.message()));
}

}  // namespace knnd
