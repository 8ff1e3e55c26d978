// The payloads step of a Search (SearchRequest.payloads): which fields the
// request asks for, resolved against the pinned snapshot before admission,
// and, after the search, the answer's payloads cut from that snapshot by
// the answer's ids (so a hot swap in between never mixes versions), sized
// before they are copied so that an answer never exceeds the largest
// message knnd sends.
//
// Thread-safety: functions over one request and one answer, owned by the
// caller; the snapshot is immutable.
#ifndef KNND_RPC_SEARCH_PAYLOADS_H_
#define KNND_RPC_SEARCH_PAYLOADS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// The fields `request` asks for on `snapshot`, or nullopt when it asks for
// no payloads. FAILED_PRECONDITION (no payloads) or INVALID_ARGUMENT (an
// unknown field, or a PayloadRequest asking for nothing) as
// IndexSnapshot::SelectPayloads says.
absl::StatusOr<absl::optional<PayloadSelection>> RequestedPayloads(
    const knnd::v1::SearchRequest& request, const IndexSnapshot& snapshot);
// The same for one PayloadRequest (a Search's or a Get's).
absl::StatusOr<PayloadSelection> SelectRequested(
    const knnd::v1::PayloadRequest& asked, const IndexSnapshot& snapshot);

// Adds to `response` (whose ids are final) the payload of each result
// entry: the selected fields as a JSON object, empty for id -1. First
// sizes the answer with them: RESOURCE_EXHAUSTED naming both sizes when it
// would exceed `max_send_message_bytes`, and `response` is left without
// payloads. Returns the payload bytes added.
absl::StatusOr<int64_t> AddPayloads(const IndexSnapshot& snapshot,
                                    const PayloadSelection& selection,
                                    int64_t max_send_message_bytes,
                                    knnd::v1::SearchResponse* response);

// The bytes one payload of `size` bytes adds to an answer: its tag (two
// bytes: field 16), its length and itself.
int64_t PayloadFieldBytes(int64_t size);

// RESOURCE_EXHAUSTED: an answer of `answer_bytes` exceeds the
// `max_send_message_bytes` limit (the message AddPayloads and the shard
// front give).
absl::Status AnswerTooLarge(int64_t answer_bytes, int64_t payload_bytes,
                            int64_t max_send_message_bytes);

}  // namespace knnd

#endif  // KNND_RPC_SEARCH_PAYLOADS_H_
