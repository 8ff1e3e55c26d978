// How knnd's servers (KnnServiceImpl and ShardFront) read a SearchRequest
// off the wire. gRPC's own reading uses protobuf's default recursion limit
// of 100 nested messages, and a request over it fails in gRPC with
// INTERNAL "Unable to parse request" before knnd sees it: a filter nested
// ~100 deep (50 with all_of, which nests two messages a level) never
// reached knnd's own check naming max_filter_depth. Here:
//   - a request parses with a recursion limit that fits a filter nested
//     kMaxFilterDepthLimit deep (the most config max_filter_depth allows),
//     bounded so that the parse's recursion, and every later walk of the
//     filter (checking, compiling, destroying it), stays within a few
//     hundred frames of stack;
//   - a request whose filter nests deeper than that (up to whatever fits
//     the message: ~900,000 levels in 4 MiB) is read without its filter,
//     which is measured by an iterative walk of its bytes (no recursion),
//     and marked, so that the handler answers INVALID_ARGUMENT naming the
//     limit (CheckFilterParsed) instead of gRPC answering INTERNAL.
// The grpc::SerializationTraits specialisation below makes gRPC call
// DeserializeSearchRequest for every SearchRequest a knnd service reads;
// it must be seen before the generated service's Request methods are
// used, so knn_service.h and shard_front.h include this header.
//
// Thread-safety: pure functions.
#ifndef KNND_RPC_SEARCH_REQUEST_CODEC_H_
#define KNND_RPC_SEARCH_REQUEST_CODEC_H_

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// The deepest filter a server reads (config max_filter_depth is at most
// this): a filter nested deeper is refused whatever the configured limit.
inline constexpr int kMaxFilterDepthLimit = 256;

// The recursion limit of the parse: a filter of kMaxFilterDepthLimit
// levels of all_of / any_of (two messages a level) plus its condition's
// range and value and the request itself, with room to spare.
inline constexpr int kSearchRequestRecursionLimit =
    2 * kMaxFilterDepthLimit + 8;

// Parses `buffer` into `request` (gRPC's SerializationTraits contract:
// INTERNAL for bytes that are no SearchRequest): as gRPC would first (the
// common case, at its speed), then with kSearchRequestRecursionLimit,
// then without a filter nesting deeper than that allows, marking the
// request (CheckFilterParsed). Clears `buffer`.
grpc::Status DeserializeSearchRequest(grpc::ByteBuffer* buffer,
                                      knnd::v1::SearchRequest* request);

// The same from contiguous bytes (tests and fuzzers); true when parsed.
bool ReadSearchRequest(const std::string& bytes,
                       knnd::v1::SearchRequest* request);

// INVALID_ARGUMENT when `request` was read without a filter that nests
// more than kMaxFilterDepthLimit deep: "filter is nested more than 256
// deep, more than max_filter_depth=16". OK otherwise (a filter read whole
// is checked against max_filter_depth by attribute_filter.h).
absl::Status CheckFilterParsed(const knnd::v1::SearchRequest& request,
                               int64_t max_filter_depth);

}  // namespace knnd

namespace grpc {

// Every SearchRequest gRPC reads for a knnd service, through
// DeserializeSearchRequest. The parameter types are SearchRequest's own
// (not MessageLite's, as protobuf's generic traits have): a translation
// unit that never sees this header instantiates the generic traits under
// other symbols, so the two never collide at link time.
template <>
class SerializationTraits<knnd::v1::SearchRequest, void> {
 public:
  static Status Serialize(const knnd::v1::SearchRequest& message,
                          ByteBuffer* buffer, bool* own_buffer) {
    return GenericSerialize<ProtoBufferWriter, knnd::v1::SearchRequest>(
        message, buffer, own_buffer);
  }
  static Status Deserialize(ByteBuffer* buffer,
                            knnd::v1::SearchRequest* message) {
    return knnd::DeserializeSearchRequest(buffer, message);
  }
};

}  // namespace grpc

#endif  // KNND_RPC_SEARCH_REQUEST_CODEC_H_
