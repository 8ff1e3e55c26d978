#include "knnd/rpc/http_json.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/rpc/status_util.h"
#include "knnd/storage/json_value.h"

namespace knnd {
namespace {

// Fields at their default are left out, as the canonical mapping does:
// printing them (always_print_primitive_fields) makes protobuf build the
// whole answer as a tree of nodes first, hundreds of bytes per value
// (measured: 230 MiB more at its peak for one answer of 4096 queries x k
// 100, whose JSON is 8.5 MB).
google::protobuf::util::JsonPrintOptions PrintOptions() {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  return options;
}

}  // namespace

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorJson(const absl::Status& status) {
  std::string out = "{\"code\":";
  AppendJsonString(absl::StatusCodeToString(status.code()), &out);
  out += ",\"message\":";
  AppendJsonString(BoundStatusMessage(status.message()), &out);
  out += "}";
  return out;
}

absl::Status ParseJsonRequest(absl::string_view body,
                              google::protobuf::Message* message) {
  const absl::string_view text = absl::StripAsciiWhitespace(body);
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      text.empty() ? "{}"
                   : google::protobuf::StringPiece(text.data(), text.size()),
      message, options);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the body is not a ", message->GetDescriptor()->full_name(),
      " in the proto's JSON mapping (docs/api.md, \"HTTP/JSON\"): ",
      std::string(parsed.message())));
}

namespace {

// `message` as JSON into `out`, sized first for it and `extra` bytes: ids
// and distances take about 3 times their binary form as JSON, and a string
// grown by doubling held twice that at its peak (measured: 11.4 MiB rather
// than 21.9 for an answer of 4096 queries x k 100).
absl::Status Print(const google::protobuf::Message& message, size_t extra,
                   std::string* out) {
  out->reserve(message.ByteSizeLong() * 3 + extra);
  const auto printed =
      google::protobuf::util::MessageToJsonString(message, out, PrintOptions());
  if (printed.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot write the answer as JSON: ",
                                          std::string(printed.message())));
}

// Adds the member "name":value (value already JSON) to the JSON object
// `object`, before its closing brace.
absl::Status SpliceMember(absl::string_view name, absl::string_view value,
                          std::string* object) {
  if (object->empty() || object->back() != '}') {
    return absl::InternalError("the answer's JSON is not an object");
  }
  std::string member = object->size() > 2 ? "," : "";
  member.reserve(name.size() + value.size() + 4);
  AppendJsonString(name, &member);
  member += ':';
  absl::StrAppend(&member, value);
  object->insert(object->size() - 1, member);
  return absl::OkStatus();
}

// One record: its id always (0 is an id, which the printer would leave
// out), its JSON bytes fields as JSON, the rest printed.
absl::Status AppendRecordJson(knnd::v1::Record& record, std::string* out) {
  // Swapped out while the rest is printed, and back.
  std::string payload;
  std::string attributes;
  record.mutable_payload()->swap(payload);
  record.mutable_attributes()->swap(attributes);
  const int64_t id = record.id();
  record.clear_id();
  std::string json;
  absl::Status printed =
      Print(record, payload.size() + attributes.size() + 48, &json);
  record.set_id(id);
  if (printed.ok()) {
    printed = SpliceMember("id", absl::StrCat("\"", id, "\""), &json);
  }
  if (printed.ok() && !payload.empty()) {
    printed = SpliceMember("payload", payload, &json);
  }
  if (printed.ok() && !attributes.empty()) {
    printed = SpliceMember("attributes", attributes, &json);
  }
  record.mutable_payload()->swap(payload);
  record.mutable_attributes()->swap(attributes);
  absl::StrAppend(out, json);
  return printed;
}

}  // namespace

absl::Status ResponseJson(google::protobuf::Message* message,
                          std::string* out) {
  return Print(*message, 0, out);
}

absl::Status ResponseJson(knnd::v1::SearchResponse* response,
                          std::string* out) {
  size_t bytes = 16;
  for (const std::string& p : response->payloads()) bytes += p.size() + 5;
  google::protobuf::RepeatedPtrField<std::string> payloads;
  payloads.Swap(response->mutable_payloads());
  absl::Status printed = Print(*response, bytes, out);
  payloads.Swap(response->mutable_payloads());
  if (!printed.ok() || response->payloads_size() == 0) return printed;
  std::string array = "[";
  array.reserve(bytes);
  for (int i = 0; i < response->payloads_size(); ++i) {
    if (i > 0) array += ',';
    const std::string& payload = response->payloads(i);
    array += payload.empty() ? "null" : payload;
  }
  array += ']';
  return SpliceMember("payloads", array, out);
}

absl::Status ResponseJson(knnd::v1::GetResponse* response, std::string* out) {
  size_t bytes = 16;
  for (const knnd::v1::Record& r : response->records()) {
    bytes += r.ByteSizeLong() * 3;
  }
  google::protobuf::RepeatedPtrField<knnd::v1::Record> records;
  records.Swap(response->mutable_records());
  absl::Status printed = Print(*response, 0, out);
  std::string array = "[";
  array.reserve(bytes);
  for (int i = 0; printed.ok() && i < records.size(); ++i) {
    if (i > 0) array += ',';
    printed = AppendRecordJson(*records.Mutable(i), &array);
  }
  records.Swap(response->mutable_records());
  if (!printed.ok()) return printed;
  array += ']';
  // An answer with no record still says so: clients read "records".
  return SpliceMember("records", array, out);
}

absl::StatusOr<absl::Time> DeadlineOf(absl::optional<absl::string_view> value,
                                      absl::Time start) {
  if (!value.has_value()) return absl::InfiniteFuture();
  int64_t ms = 0;
  if (!absl::SimpleAtoi(*value, &ms) || ms < 1 || ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header ", kTimeoutHeader, ": ", *value,
        " is not a whole number of milliseconds in [1, ", kMaxTimeoutMs, "]"));
  }
  return start + absl::Milliseconds(ms);
}

std::vector<std::pair<std::string, std::string>> TrailerHeaders(
    const std::vector<std::pair<std::string, std::string>>& trailers) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [key, value] : trailers) {
    int64_t ms = 0;
    if (key == kPushbackMetadata && absl::SimpleAtoi(value, &ms)) {
      headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(
                                              1, (ms + 999) / 1000)));
      headers.emplace_back("X-Knnd-Retry-Pushback-Ms", value);
    } else {
      headers.emplace_back(key, value);
    }
  }
  return headers;
}

}  // namespace knnd
