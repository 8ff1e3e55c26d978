#include "knnd/rpc/search_request_codec.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace knnd {
namespace {

using knnd::v1::SearchRequest;

// Field numbers of the wire format walked here (knn_service.proto).
constexpr uint64_t kRequestFilter = 12;     // SearchRequest.filter
constexpr uint64_t kFilterAllOf = 2;        // Filter.all_of (FilterList)
constexpr uint64_t kFilterAnyOf = 3;        // Filter.any_of (FilterList)
constexpr uint64_t kFilterNegate = 4;       // Filter.negate (Filter)
constexpr uint64_t kFilterListFilters = 1;  // FilterList.filters (Filter)
// The mark of a request read without its filter, as an unknown field:
// the largest field number protobuf allows, which no knnd message uses.
constexpr int kFilterTooDeepMark = (1 << 29) - 1;

constexpr uint64_t kWireVarint = 0;
constexpr uint64_t kWireFixed64 = 1;
constexpr uint64_t kWireLength = 2;
constexpr uint64_t kWireFixed32 = 5;

bool ParseBounded(google::protobuf::io::ZeroCopyInputStream* stream,
                  SearchRequest* request) {
  google::protobuf::io::CodedInputStream input(stream);
  input.SetTotalBytesLimit(INT_MAX);
  input.SetRecursionLimit(kSearchRequestRecursionLimit);
  return request->ParseFromCodedStream(&input) && input.ConsumedEntireMessage();
}

bool ReadVarint(const uint8_t*& p, const uint8_t* end, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t byte = *p++;
    result |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80u) == 0) {
      *value = result;
      return true;
    }
  }
  return false;
}

// One field of a message in [p, end): its number, wire type and, for a
// length-delimited one, its value's bytes; `p` moves past it. false when
// malformed (or a group, which no knnd message has).
struct Field {
  uint64_t number = 0;
  uint64_t wire_type = 0;
  const uint8_t* value = nullptr;
  const uint8_t* value_end = nullptr;
};
bool ReadField(const uint8_t*& p, const uint8_t* end, Field* field) {
  uint64_t tag = 0;
  if (!ReadVarint(p, end, &tag)) return false;
  field->number = tag >> 3;
  field->wire_type = tag & 7;
  if (field->number == 0) return false;
  uint64_t skip = 0;
  switch (field->wire_type) {
    case kWireVarint:
      return ReadVarint(p, end, &skip);
    case kWireFixed64:
      skip = 8;
      break;
    case kWireFixed32:
      skip = 4;
      break;
    case kWireLength:
      if (!ReadVarint(p, end, &skip)) return false;
      field->value = p;
      break;
    default:
      return false;
  }
  if (skip > static_cast<uint64_t>(end - p)) return false;
  p += skip;
  field->value_end = p;
  return true;
}

// The nesting depth of the Filter encoded in [begin, end), counted as
// attribute_filter.h counts it (a lone condition is 1; each all_of,
// any_of or negate adds one), without recursion: an explicit stack of
// the messages entered, abandoned once the depth passes `cap` (then
// cap + 1 is returned). -1 for bytes that are no Filter.
int FilterDepth(const uint8_t* begin, const uint8_t* end, int cap) {
  struct Frame {
    const uint8_t* end;
    bool list;  // a FilterList, else a Filter
    int depth;  // of the Filter it is, or holds the filters of
  };
  std::vector<Frame> stack;
  Frame current{end, false, 1};
  const uint8_t* p = begin;
  int deepest = 1;
  for (;;) {
    if (p == current.end) {
      if (stack.empty()) return deepest;
      current = stack.back();
      stack.pop_back();
      continue;
    }
    Field field;
    if (!ReadField(p, current.end, &field)) return -1;
    if (field.wire_type != kWireLength) continue;
    Frame inner{field.value_end, false, current.depth};
    if (!current.list &&
        (field.number == kFilterAllOf || field.number == kFilterAnyOf)) {
      inner.list = true;
    } else if ((!current.list && field.number == kFilterNegate) ||
               (current.list && field.number == kFilterListFilters)) {
      inner.depth = current.depth + 1;
      deepest = std::max(deepest, inner.depth);
      if (deepest > cap) return deepest;
    } else {
      continue;  // a condition or another field: no filter inside
    }
    stack.push_back(current);
    current = inner;
    p = field.value;
  }
}

// A request that failed the bounded parse: when that is for a filter
// nesting more than kMaxFilterDepthLimit deep, `request` is the rest of
// it, marked (CheckFilterParsed), and true is returned; false otherwise.
bool ParseWithoutDeepFilter(const std::string& bytes, SearchRequest* request) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* const end = p + bytes.size();
  std::string rest;
  int deepest = 0;
  while (p < end) {
    const uint8_t* const start = p;
    Field field;
    if (!ReadField(p, end, &field)) return false;
    if (field.number == kRequestFilter && field.wire_type == kWireLength) {
      const int depth =
          FilterDepth(field.value, field.value_end, kMaxFilterDepthLimit);
      if (depth < 0) return false;
      deepest = std::max(deepest, depth);
      continue;
    }
    rest.append(reinterpret_cast<const char*>(start),
                static_cast<size_t>(p - start));
  }
  if (deepest <= kMaxFilterDepthLimit)
    return false;  // failed for another reason
  google::protobuf::io::ArrayInputStream stream(rest.data(),
                                                static_cast<int>(rest.size()));
  if (!ParseBounded(&stream, request)) return false;
  request->GetReflection()->MutableUnknownFields(request)->AddVarint(
      kFilterTooDeepMark, static_cast<uint64_t>(deepest));
  return true;
}

}  // namespace

grpc::Status DeserializeSearchRequest(grpc::ByteBuffer* buffer,
                                      SearchRequest* request) {
  if (buffer == nullptr) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "No payload");
  }
  bool parsed = false;
  {
    // gRPC's own way first (protobuf's default limit of 100 nested
    // messages): the common case stays parsed exactly as it was, without
    // the CodedInputStream a limit of our own needs (80 against 88 ns for
    // a one-query request, measured here).
    grpc::ProtoBufferReader reader(buffer);
    if (!reader.status().ok()) return reader.status();
    parsed = request->ParseFromZeroCopyStream(&reader);
  }
  if (!parsed) {
    grpc::ProtoBufferReader reader(buffer);
    parsed = reader.status().ok() && ParseBounded(&reader, request);
  }
  if (!parsed) {
    // Rare (a malformed request, or a filter nested too deep): the bytes
    // in one piece for the walk.
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (buffer->Dump(&slices).ok()) {
      for (const grpc::Slice& slice : slices) {
        bytes.append(reinterpret_cast<const char*>(slice.begin()),
                     slice.size());
      }
      parsed = ParseWithoutDeepFilter(bytes, request);
    }
  }
  buffer->Clear();
  if (parsed) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "the request is not a knnd.v1.SearchRequest");
}

bool ReadSearchRequest(const std::string& bytes, SearchRequest* request) {
  google::protobuf::io::ArrayInputStream stream(bytes.data(),
                                                static_cast<int>(bytes.size()));
  return request->ParseFromString(bytes) || ParseBounded(&stream, request) ||
         ParseWithoutDeepFilter(bytes, request);
}

absl::Status CheckFilterParsed(const SearchRequest& request,
                               int64_t max_filter_depth) {
  const google::protobuf::UnknownFieldSet& unknown =
      request.GetReflection()->GetUnknownFields(request);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() != kFilterTooDeepMark) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "filter is nested more than ", kMaxFilterDepthLimit,
        " deep, more than max_filter_depth=", max_filter_depth,
        " (knnd reads filters at most ", kMaxFilterDepthLimit, " deep)"));
  }
  return absl::OkStatus();
}

}  // namespace knnd
