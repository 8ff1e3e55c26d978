// The stored records of given ids from one pinned version: what
// KnnService.Get answers (Chroma's get, Qdrant's retrieve, LangChain's
// get_by_ids). Ids map to rows through the snapshot's ListIds (the id
// table of an index built with its own ids, else row numbers, a shard's
// first id counted); a record is the row's payload fields asked for, its
// attributes as one JSON object and its raw vector (the re-ranking file),
// each read from the mapped files of that version only.
//
// Two steps, so that the answer is sized before anything large is built
// and the gate can be asked for its bytes: PlanRecords() validates the
// ids, finds their rows, measures each payload and builds the (small)
// attribute objects; FillRecords() then writes the answer.
//
// Thread-safety: functions over one request, owned by the caller; the
// snapshot is immutable.
#ifndef KNND_INDEX_GET_RECORDS_H_
#define KNND_INDEX_GET_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// What a Get asks for beside the ids.
struct RecordsAsk {
  const PayloadSelection* payloads = nullptr;  // null: no payloads
  bool attributes = false;
  bool vectors = false;
};

// The records of one Get, found but not yet written.
struct RecordsPlan {
  // The ids the version holds, once each, in the order of their first
  // mention, and their rows.
  std::vector<int64_t> ids;
  std::vector<int64_t> rows;
  // The ids it does not hold, once each, in the request's order.
  std::vector<int64_t> missing;
  // Per found id: its payload's JSON bytes (empty without payloads) and
  // its attributes as a JSON object (empty without attributes).
  std::vector<int64_t> payload_bytes;
  std::vector<std::string> attributes;
  // The answer's encoded size, at most (GetResponse without its version
  // fields): what the gate is asked for and what max_send_message_bytes
  // bounds.
  int64_t answer_bytes = 0;
};

// FAILED_PRECONDITION naming the version when `ask` wants attributes or
// vectors that `snapshot` does not have (payloads are checked when they
// are selected: IndexSnapshot::SelectPayloads).
absl::Status CheckRecordsAsk(const IndexSnapshot& snapshot,
                             const RecordsAsk& ask);

// INVALID_ARGUMENT naming the limit for no ids, more than `max_ids` (0:
// not checked, e.g. a front of shards that has not heard the shards'
// limit) or a negative id.
absl::Status CheckGetIds(absl::Span<const int64_t> ids, int64_t max_ids);

// The plan of a Get of `ids`, which CheckGetIds() checks first.
absl::StatusOr<RecordsPlan> PlanRecords(const IndexSnapshot& snapshot,
                                        absl::Span<const int64_t> ids,
                                        const RecordsAsk& ask, int64_t max_ids);

// Writes `plan`'s records (their attributes moved out of it) and missing
// ids into `response`.
void FillRecords(const IndexSnapshot& snapshot, const RecordsAsk& ask,
                 RecordsPlan& plan, knnd::v1::GetResponse* response);

// Each of `rows` (distinct, each < store.rows()) as one compact JSON
// object in the attributes file's form: integers and floats as numbers,
// timestamps as RFC 3339 UTC strings, keywords as strings, keyword lists
// as arrays of strings (in dictionary order); a column without a value
// left out. Keyword columns are read from their postings (the store keeps
// no row -> keyword array): per keyword, the shorter side is searched in
// the other, so the cost stays below one pass over the postings.
std::vector<std::string> AttributesJson(const AttributeStore& store,
                                        absl::Span<const int64_t> rows);

}  // namespace knnd

#endif  // KNND_INDEX_GET_RECORDS_H_
