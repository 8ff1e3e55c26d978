// UpdatePlan: which row of a new index version comes from where, when a
// version is made from the previous one plus a delta (`knnctl update`,
// index_update.h): deletions, upserts (an id the base holds, given a new
// vector) and additions. Every per-row file of a version (the inverted
// lists' row numbers, INDEX.vectors, INDEX.ids, and any companion file
// keyed by row, such as attributes or payloads) is carried to the new
// version by the same mapping, `rows`: new row -> base row or input row.
//
// The order: the base's rows in their order, a deleted row left out and
// an upserted row replaced in place by its input row; then the additions
// in input order. Ids never change meaning: an index with row ids (no id
// table) keeps them as ids, so when a deletion would renumber the rows
// after it, the new version gets an id table holding the old row numbers
// (it becomes an own-ids index); while only appending or replacing rows,
// it stays a row-id index.
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_UPDATE_PLAN_H_
#define KNND_INDEX_UPDATE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace knnd {

// Where one row of the new version comes from.
struct RowSource {
  enum class From { kBase, kInput };
  From from = From::kBase;
  int64_t row = 0;  // a row of the base, or of the update's input
  bool operator==(const RowSource& o) const {
    return from == o.from && row == o.row;
  }
};

struct UpdatePlan {
  std::vector<RowSource> rows;            // new row -> its source
  std::vector<int64_t> ids;               // new row -> the id answers carry
  std::vector<int64_t> new_row_of_base;   // base row -> new row, -1 if gone
  std::vector<int64_t> new_row_of_input;  // input row -> new row
  // True when ids[r] == r for every row: no id table is needed.
  bool row_ids = false;
  int64_t kept = 0;
  int64_t upserted = 0;
  int64_t added = 0;
  int64_t deleted = 0;
  int64_t deletions_absent = 0;  // ids to delete the base does not hold
  std::vector<int64_t> absent_deletions;  // those ids, ascending
};

// `base_ids`: the base's id of each row (with row ids, 0..n-1);
// `input_ids`: the id of each input row; `deletions`: ids to delete.
// INVALID_ARGUMENT naming the file (`input_name`, the input ids' source,
// or `deletions_name`), the row and the id when an id is negative
// (CheckIdsNonNegative), and naming `input_name` and the id when an input
// id is given twice or an id is both deleted and given a vector.
absl::StatusOr<UpdatePlan> PlanUpdate(absl::Span<const int64_t> base_ids,
                                      absl::Span<const int64_t> input_ids,
                                      absl::Span<const int64_t> deletions,
                                      const std::string& input_name,
                                      const std::string& deletions_name);

// The ids a row-id index gives `count` new input rows when none are given:
// the ids after the base's largest (base_ids.size() for a row-id base).
std::vector<int64_t> NextIds(absl::Span<const int64_t> base_ids, int64_t count);

}  // namespace knnd

#endif  // KNND_INDEX_UPDATE_PLAN_H_
