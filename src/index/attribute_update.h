// Carries an index's attribute store (storage/attribute_store.h) through
// `knnctl update` (index_update.h, docs/updates.md): the new version's
// columns row by row in UpdatePlan's order (update_plan.h), a base row
// keeping its values and an input row taking its line of the delta
// (`--attributes`, JSON Lines as `knnctl build --attributes` reads them).
//
// Schema: a column keeps its name and type through updates. A delta
// column the base has must be of the base's type (integers where the base
// has floats are widened, as they are within one build's file; strings
// that all happen to be date-times stay keywords where the base has
// keywords); anything else is INVALID_ARGUMENT naming the column and both
// types, rebuild to change a type. A base column the delta lacks has no
// value on the input's rows. A column only the delta has is added, with
// no value on the base's rows, and reported (so that a misspelt name
// shows). Keyword dictionaries gain the delta's new keywords and lose
// those no row holds any more.
//
// Memory: the new version's columns are built in memory (AttributeColumns:
// per row a presence bit, 8 bytes per numeric column, and 8 bytes plus 4
// per keyword per keyword column), with the delta's; WriteAttributeStore()
// then lays the file out in memory, as `knnctl build --attributes` does.
// The base's store is only read through its mapping.
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_ATTRIBUTE_UPDATE_H_
#define KNND_INDEX_ATTRIBUTE_UPDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/index/update_plan.h"
#include "knnd/storage/attribute_store.h"

namespace knnd {

struct AttributeDelta {
  AttributeColumns columns;  // one row per input row
  // The delta's columns the base does not have, in the delta's order.
  std::vector<std::string> added_columns;
};

// Reads `path` (`input_rows` lines, as ReadAttributesJsonl; with
// `only_fields`, the payloads file and those of its fields) and checks its
// columns against `base`'s. INVALID_ARGUMENT (NOT_FOUND for a missing
// file) naming --attributes and `path`.
absl::StatusOr<AttributeDelta> ReadAttributeDelta(
    const std::string& path, int64_t input_rows, const AttributeStore& base,
    const std::vector<std::string>* only_fields = nullptr);

// The new version's columns: `base`'s in its order, then the columns only
// `delta` (from ReadAttributeDelta; none for a deletions-only update) has.
// INVALID_ARGUMENT when `plan` was made for other row counts; DATA_LOSS
// naming `base` when a keyword's postings name a row it does not have.
absl::StatusOr<AttributeColumns> UpdatedAttributes(const UpdatePlan& plan,
                                                   const AttributeStore& base,
                                                   const AttributeDelta& delta);

}  // namespace knnd

#endif  // KNND_INDEX_ATTRIBUTE_UPDATE_H_
