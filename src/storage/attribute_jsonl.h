// Reads the attributes `knnctl build --attributes FILE` takes: JSON Lines,
// line i holding the attributes of vector row i as one JSON object
// ({"genre": "news", "year": 2021, "tags": ["a", "b"]}; {} for a row
// without any). A missing member or null is no value. Each member name is
// a column whose type is inferred over the whole file:
//   integer       every value an integer (exact int64)
//   float         numbers, at least one not an integer
//   timestamp     every value an RFC 3339 date-time string
//                 ("2023-05-01T12:00:00Z", offsets and fractions allowed),
//                 stored as int64 microseconds since the Unix epoch
//   keyword       strings (any other string)
//   keyword_list  arrays of strings (tags; [] is no value)
// Anything else (booleans, objects, arrays of non-strings) and a column
// mixing kinds are INVALID_ARGUMENT naming the file, the line and the
// field.
//
// Thread-safety: a pure function of the file.
#ifndef KNND_STORAGE_ATTRIBUTE_JSONL_H_
#define KNND_STORAGE_ATTRIBUTE_JSONL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "knnd/storage/attribute_store.h"

namespace knnd {

// The columns of `path`, which must hold exactly `expect_rows` lines. A
// column named in `keyword_columns` whose strings are all date-times stays
// a keyword column: the delta of an update whose base holds that column
// as keywords (index/attribute_update.h) keeps the base's type.
// With `only_fields` (knnctl build --attribute_fields: the attributes are
// fields of the payloads file) only those members are columns, the others
// are skipped unread, and a line that is a JSON string (a payload stored
// as {"text": ...}) is a row without attributes.
absl::StatusOr<AttributeColumns> ReadAttributesJsonl(
    const std::string& path, int64_t expect_rows,
    const absl::flat_hash_set<std::string>& keyword_columns = {},
    const std::vector<std::string>* only_fields = nullptr);

// `text` as RFC 3339 date-time, in microseconds since the Unix epoch;
// nullopt when it is not one. Filters compare timestamps given as strings
// through it too.
std::optional<int64_t> ParseTimestampMicros(absl::string_view text);

}  // namespace knnd

#endif  // KNND_STORAGE_ATTRIBUTE_JSONL_H_
