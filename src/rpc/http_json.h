// The HTTP/JSON forms of knnd's API (docs/api.md, "HTTP/JSON"), apart from
// any HTTP library: request bodies are the proto's canonical JSON mapping,
// read by protobuf's own parser (no second schema to keep in step), and
// answers are written by protobuf's printer with the proto's field names;
// statuses map to HTTP's as google.rpc.Code documents.
//
// Thread-safety: pure functions.
#ifndef KNND_RPC_HTTP_JSON_H_
#define KNND_RPC_HTTP_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// The header that carries a call's deadline, in milliseconds from the
// request's arrival (gRPC's grpc-timeout, in one unit).
inline constexpr char kTimeoutHeader[] = "X-Knnd-Timeout-Ms";
// The longest deadline the header may ask for: a day.
inline constexpr int64_t kMaxTimeoutMs = int64_t{86400000};

// The HTTP status of a gRPC status code: OK 200, INVALID_ARGUMENT,
// FAILED_PRECONDITION and OUT_OF_RANGE 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS and ABORTED 409,
// RESOURCE_EXHAUSTED 429, CANCELLED 499, UNIMPLEMENTED 501, UNAVAILABLE
// 503, DEADLINE_EXCEEDED 504, the others 500.
int HttpStatusOf(absl::StatusCode code);

// The body of an error answer: {"code":"INVALID_ARGUMENT","message":"..."},
// the code's name and the message as gRPC sends it (status_util.h bounds).
std::string ErrorJson(const absl::Status& status);

// `body` (the proto's JSON mapping; empty reads as {}) into `message`.
// Field names as in the .proto or lowerCamelCase; int64 fields as strings
// or numbers; bytes fields as base64; an unknown field, a wrong type or
// malformed JSON is INVALID_ARGUMENT naming the message type and
// protobuf's reason.
absl::Status ParseJsonRequest(absl::string_view body,
                              google::protobuf::Message* message);

// `message` as JSON: the proto's field names, fields at their default left
// out (the canonical mapping's choice), enums by name, int64 as strings,
// bytes as base64.
// An answer with a field whose bytes hold JSON has an overload of its own
// that writes them as JSON (an HTTP route picks it by type).
absl::Status ResponseJson(google::protobuf::Message* message, std::string* out);
// The same, with SearchResponse.payloads (stored JSON objects) spliced in
// as JSON objects rather than base64, null for a missing neighbour's (the
// key left out without payloads). The payloads are moved out while the
// rest is printed, and back.
absl::Status ResponseJson(knnd::v1::SearchResponse* response, std::string* out);
// GetResponse likewise: each record's payload and attributes as JSON
// objects (left out when empty), its id always (also 0), and "records"
// always (an empty array when every id is missing).
absl::Status ResponseJson(knnd::v1::GetResponse* response, std::string* out);

// The deadline a request asks for with kTimeoutHeader, counted from
// `start`; InfiniteFuture without one. INVALID_ARGUMENT naming the header
// and the range when it is not a whole number of milliseconds in
// [1, kMaxTimeoutMs].
absl::StatusOr<absl::Time> DeadlineOf(absl::optional<absl::string_view> value,
                                      absl::Time start);

// The response headers of trailers a call added (server_call.h): the
// retry pushback as Retry-After (whole seconds, at least 1) and as
// X-Knnd-Retry-Pushback-Ms, the others under their own names.
std::vector<std::pair<std::string, std::string>> TrailerHeaders(
    const std::vector<std::pair<std::string, std::string>>& trailers);

}  // namespace knnd

#endif  // KNND_RPC_HTTP_JSON_H_
