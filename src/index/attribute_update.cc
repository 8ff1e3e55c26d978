#include "knnd/index/attribute_update.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "knnd/storage/attribute_jsonl.h"

namespace knnd {
namespace {

const AttributeColumn* FindColumn(const AttributeColumns& columns,
                                  const std::string& name) {
  for (const AttributeColumn& column : columns.columns) {
    if (column.name == name) return &column;
  }
  return nullptr;
}

// Whether a delta column read as `delta` may join a base column of type
// `base`: the same type, or integers where the base has floats (a build
// file mixing them makes a float column too).
bool Compatible(AttributeType base, AttributeType delta) {
  return base == delta ||
         (base == AttributeType::kFloat && delta == AttributeType::kInteger);
}

// The new version's numeric column `name` of `type`: a base row's value
// from `base` (null: the base lacks the column), an input row's from
// `delta` (null: the delta lacks it).
AttributeColumn CarryNumeric(const UpdatePlan& plan, const std::string& name,
                             AttributeType type,
                             const AttributeStore::Column* base,
                             const AttributeColumn* delta) {
  const size_t n = plan.rows.size();
  const bool floats = type == AttributeType::kFloat;
  AttributeColumn out;
  out.name = name;
  out.type = type;
  out.present.assign(n, false);
  if (floats) {
    out.floats.assign(n, 0);
  } else {
    out.ints.assign(n, 0);
  }
  for (size_t r = 0; r < n; ++r) {
    const int64_t row = plan.rows[r].row;
    if (plan.rows[r].from == RowSource::From::kBase) {
      if (base == nullptr || !base->Has(row)) continue;
      out.present[r] = true;
      if (floats) {
        out.floats[r] = base->floats[row];
      } else {
        out.ints[r] = base->ints[row];
      }
      continue;
    }
    if (delta == nullptr || !delta->present[row]) continue;
    out.present[r] = true;
    if (!floats) {
      out.ints[r] = delta->ints[row];
    } else {
      out.floats[r] = delta->type == AttributeType::kFloat
                          ? delta->floats[row]
                          : static_cast<double>(delta->ints[row]);
    }
  }
  return out;
}

// Drops the keywords no row holds any more (those only deleted or
// replaced rows held), so that the dictionary's size stays the count of
// keywords in use, as a build's is.
void DropUnusedKeywords(AttributeColumn& column) {
  constexpr uint32_t kUnused = UINT32_MAX;
  std::vector<uint32_t> renumber(column.dictionary.size(), kUnused);
  for (uint32_t code : column.codes) renumber[code] = 0;
  std::vector<std::string> kept;
  for (size_t i = 0; i < column.dictionary.size(); ++i) {
    if (renumber[i] == kUnused) continue;
    renumber[i] = static_cast<uint32_t>(kept.size());
    kept.push_back(std::move(column.dictionary[i]));
  }
  column.dictionary = std::move(kept);
  for (uint32_t& code : column.codes) code = renumber[code];
}

// The new version's keyword or keyword-list column `name`, as
// CarryNumeric's. The base's store holds keyword -> rows only, so each new
// row's keywords are counted from the postings, the counts summed into
// each row's end, and the codes placed back to front, which leaves
// offsets[r] at row r's start: no per-row copy of the base beside the
// output.
absl::StatusOr<AttributeColumn> CarryKeywords(
    const UpdatePlan& plan, const std::string& name, AttributeType type,
    const AttributeStore::Column* base, const AttributeColumn* delta,
    const std::string& base_path) {
  const size_t n = plan.rows.size();
  AttributeColumn out;
  out.name = name;
  out.type = type;
  // The base's keywords keep their index; the delta's new ones follow.
  const int64_t base_keywords = base == nullptr ? 0 : base->count;
  const int64_t base_rows = static_cast<int64_t>(plan.new_row_of_base.size());
  for (int64_t k = 0; k < base_keywords; ++k) {
    out.dictionary.emplace_back(base->Keyword(k));
    for (int64_t row : base->Postings(k)) {
      if (row < 0 || row >= base_rows) {
        return absl::DataLossError(absl::StrCat(
            "attribute store ", base_path, " is corrupt: column \"", name,
            "\" lists row ", row, " of ", base_rows));
      }
    }
  }
  std::vector<uint32_t> code_of_delta;
  const int64_t delta_rows =
      delta == nullptr ? 0 : static_cast<int64_t>(delta->present.size());
  if (delta != nullptr) {
    code_of_delta.reserve(delta->dictionary.size());
    for (const std::string& keyword : delta->dictionary) {
      const int64_t k = base == nullptr ? -1 : base->FindKeyword(keyword);
      if (k >= 0) {
        code_of_delta.push_back(static_cast<uint32_t>(k));
      } else {
        code_of_delta.push_back(static_cast<uint32_t>(out.dictionary.size()));
        out.dictionary.push_back(keyword);
      }
    }
  }
  std::vector<int64_t>& offsets = out.offsets;
  offsets.assign(n + 1, 0);
  for (int64_t k = 0; k < base_keywords; ++k) {
    for (int64_t row : base->Postings(k)) {
      const int64_t to = plan.new_row_of_base[row];
      if (to >= 0) ++offsets[to];
    }
  }
  for (int64_t i = 0; i < delta_rows; ++i) {
    offsets[plan.new_row_of_input[i]] +=
        delta->offsets[i + 1] - delta->offsets[i];
  }
  int64_t total = 0;
  for (size_t r = 0; r < n; ++r) {
    total += offsets[r];
    offsets[r] = total;
  }
  offsets[n] = total;
  out.codes.resize(static_cast<size_t>(total));
  // Back to front, so that a row's keywords keep their order: the base's
  // in its dictionary's, the delta's as the line lists them.
  for (int64_t i = delta_rows - 1; i >= 0; --i) {
    const int64_t to = plan.new_row_of_input[i];
    for (int64_t j = delta->offsets[i + 1] - 1; j >= delta->offsets[i]; --j) {
      out.codes[--offsets[to]] = code_of_delta[delta->codes[j]];
    }
  }
  for (int64_t k = base_keywords - 1; k >= 0; --k) {
    for (int64_t row : base->Postings(k)) {
      const int64_t to = plan.new_row_of_base[row];
      if (to >= 0) out.codes[--offsets[to]] = static_cast<uint32_t>(k);
    }
  }
  out.present.resize(n);
  for (size_t r = 0; r < n; ++r) out.present[r] = offsets[r + 1] > offsets[r];
  DropUnusedKeywords(out);
  return out;
}

absl::StatusOr<AttributeColumn> Carry(const UpdatePlan& plan,
                                      const std::string& name,
                                      AttributeType type,
                                      const AttributeStore::Column* base,
                                      const AttributeColumn* delta,
                                      const std::string& base_path) {
  if (IsNumeric(type)) return CarryNumeric(plan, name, type, base, delta);
  return CarryKeywords(plan, name, type, base, delta, base_path);
}

}  // namespace

absl::StatusOr<AttributeDelta> ReadAttributeDelta(
    const std::string& path, int64_t input_rows, const AttributeStore& base,
    const std::vector<std::string>* only_fields) {
  absl::flat_hash_set<std::string> keyword_columns;
  for (const AttributeStore::Column& column : base.columns()) {
    if (column.type == AttributeType::kKeyword) {
      keyword_columns.insert(column.name);
    }
  }
  absl::StatusOr<AttributeColumns> read =
      ReadAttributesJsonl(path, input_rows, keyword_columns, only_fields);
  if (!read.ok()) {
    return absl::Status(
        read.status().code(),
        absl::StrCat("--attributes: ", read.status().message()));
  }
  AttributeDelta delta;
  for (const AttributeColumn& column : read->columns) {
    const AttributeStore::Column* in_base = base.Find(column.name);
    if (in_base == nullptr) {
      delta.added_columns.push_back(column.name);
    } else if (!Compatible(in_base->type, column.type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--attributes ", path, ": attribute \"", column.name, "\" reads as ",
          AttributeTypeName(column.type), " but is ",
          AttributeTypeName(in_base->type), " in the base's ", base.path(),
          "; a column keeps its type through updates (rebuild the index "
          "to change it)"));
    }
  }
  delta.columns = std::move(*read);
  return delta;
}

absl::StatusOr<AttributeColumns> UpdatedAttributes(
    const UpdatePlan& plan, const AttributeStore& base,
    const AttributeDelta& delta) {
  const int64_t input_rows = static_cast<int64_t>(plan.new_row_of_input.size());
  if (base.rows() != static_cast<int64_t>(plan.new_row_of_base.size()) ||
      (!delta.columns.columns.empty() && delta.columns.rows != input_rows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the update plans ", plan.new_row_of_base.size(), " base rows and ",
        input_rows, " input rows; the attributes hold ", base.rows(), " and ",
        delta.columns.rows));
  }
  AttributeColumns out;
  out.rows = static_cast<int64_t>(plan.rows.size());
  for (const AttributeStore::Column& column : base.columns()) {
    absl::StatusOr<AttributeColumn> carried =
        Carry(plan, column.name, column.type, &column,
              FindColumn(delta.columns, column.name), base.path());
    if (!carried.ok()) return carried.status();
    out.columns.push_back(std::move(*carried));
  }
  for (const AttributeColumn& column : delta.columns.columns) {
    if (base.Find(column.name) != nullptr) continue;
    absl::StatusOr<AttributeColumn> carried =
        Carry(plan, column.name, column.type, nullptr, &column, base.path());
    if (!carried.ok()) return carried.status();
    out.columns.push_back(std::move(*carried));
  }
  return out;
}

}  // namespace knnd
