#include "knnd/index/attribute_filter.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/storage/attribute_jsonl.h"

namespace knnd {
namespace {

using knnd::v1::AttributeValue;
using knnd::v1::Condition;
using knnd::v1::Filter;

absl::Status Invalid(const std::string& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// Conditions plus in-list values, and the depth, of `filter`; the first
// structural mistake (an empty case or list) as an error.
absl::Status Measure(const Filter& filter, const std::string& where,
                     int depth, int64_t& conditions, int& max_depth) {
  max_depth = std::max(max_depth, depth);
  switch (filter.expression_case()) {
    case Filter::kCondition:
      conditions += 1;
      if (filter.condition().test_case() == Condition::kIn) {
        conditions += filter.condition().in().values_size();
      }
      return absl::OkStatus();
    case Filter::kAllOf:
    case Filter::kAnyOf: {
      const bool all = filter.expression_case() == Filter::kAllOf;
      const auto& list = all ? filter.all_of() : filter.any_of();
      const std::string name = absl::StrCat(where, all ? ".all_of" : ".any_of");
      if (list.filters().empty()) {
        return Invalid(name, "holds no filter; give at least one");
      }
      for (int i = 0; i < list.filters_size(); ++i) {
        if (absl::Status s = Measure(list.filters(i),
                                     absl::StrCat(name, "[", i, "]"),
                                     depth + 1, conditions, max_depth);
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
    case Filter::kNegate:
      return Measure(filter.negate(), absl::StrCat(where, ".negate"), depth + 1,
                     conditions, max_depth);
    case Filter::EXPRESSION_NOT_SET:
      break;
  }
  return Invalid(where,
                 "sets none of condition, all_of, any_of and negate");
}

// The first condition's field, for the error of a filter on an index
// without attributes.
std::string FirstField(const Filter& filter) {
  switch (filter.expression_case()) {
    case Filter::kCondition:
      return filter.condition().field();
    case Filter::kAllOf:
      return FirstField(filter.all_of().filters(0));
    case Filter::kAnyOf:
      return FirstField(filter.any_of().filters(0));
    case Filter::kNegate:
      return FirstField(filter.negate());
    case Filter::EXPRESSION_NOT_SET:
      break;
  }
  return "";
}

std::string Describe(const AttributeValue& value) {
  switch (value.value_case()) {
    case AttributeValue::kIntValue:
      return absl::StrCat("int_value ", value.int_value());
    case AttributeValue::kFloatValue:
      return absl::StrCat("float_value ", value.float_value());
    case AttributeValue::kKeyword:
      return absl::StrCat("keyword \"", value.keyword(), "\"");
    case AttributeValue::VALUE_NOT_SET:
      break;
  }
  return "an empty value";
}

// Compiles the conditions of one column.
class ColumnCompiler {
 public:
  ColumnCompiler(const AttributeStore::Column& column, std::string where)
      : column_(column), where_(std::move(where)) {}

  absl::StatusOr<RowBitmap> Compile(const Condition& condition) const {
    RowBitmap rows(column_.rows);
    switch (condition.test_case()) {
      case Condition::kExists:
        rows.OrWords(column_.presence);
        if (!condition.exists()) rows.Invert();
        return rows;
      case Condition::kEq:
        if (absl::Status s = AddEqual(condition.eq(), "eq", rows); !s.ok()) {
          return s;
        }
        return rows;
      case Condition::kIn:
        if (condition.in().values().empty()) {
          return Invalid(where_, absl::StrCat("in-list of \"", column_.name,
                                              "\" is empty; give at least "
                                              "one value"));
        }
        for (int i = 0; i < condition.in().values_size(); ++i) {
          if (absl::Status s = AddEqual(condition.in().values(i),
                                        absl::StrCat("in[", i, "]"), rows);
              !s.ok()) {
            return s;
          }
        }
        return rows;
      case Condition::kRange:
        if (absl::Status s = AddRange(condition.range(), rows); !s.ok()) {
          return s;
        }
        return rows;
      case Condition::TEST_NOT_SET:
        break;
    }
    return Invalid(where_, absl::StrCat("the condition on \"", column_.name,
                                        "\" sets no test (eq, in, range or "
                                        "exists)"));
  }

  // `condition`, an eq or a range on this numeric column, as its bounds
  // and the slice of the column's sorted rows it admits; errors as
  // Compile().
  absl::StatusOr<ColumnRange> CompileRange(const Condition& condition) const {
    Bound lo;
    Bound hi;
    if (condition.test_case() == Condition::kEq) {
      absl::StatusOr<Bound> bound = BoundOf(condition.eq(), true, "eq");
      if (!bound.ok()) return bound.status();
      lo = hi = *bound;
    } else if (absl::Status s = RangeBounds(condition.range(), lo, hi);
               !s.ok()) {
      return s;
    }
    ColumnRange range;
    range.rows = column_.rows;
    range.presence = column_.presence;
    range.lo_inclusive = !lo.set || lo.inclusive;
    range.hi_inclusive = !hi.set || hi.inclusive;
    const int64_t* first = nullptr;
    if (column_.type == AttributeType::kFloat) {
      range.floats = column_.floats;
      if (lo.set) range.lo_float = lo.f;
      if (hi.set) range.hi_float = hi.f;
      const auto [begin, end] =
          Between(column_.sorted_floats, lo, hi, lo.f, hi.f);
      first = column_.sorted_rows + (begin - column_.sorted_floats);
      range.matched = end - begin;
    } else {
      range.ints = column_.ints;
      if (lo.set) range.lo_int = lo.i;
      if (hi.set) range.hi_int = hi.i;
      const auto [begin, end] =
          Between(column_.sorted_ints, lo, hi, lo.i, hi.i);
      first = column_.sorted_rows + (begin - column_.sorted_ints);
      range.matched = end - begin;
    }
    range.matched_rows = first;
    return range;
  }

 private:
  // A numeric bound in the column's own type.
  struct Bound {
    bool set = false;
    bool inclusive = false;
    int64_t i = 0;
    double f = 0;
  };

  absl::Status WrongType(const AttributeValue& value,
                         absl::string_view test) const {
    std::string takes;
    switch (column_.type) {
      case AttributeType::kInteger:
        takes = "int_value";
        break;
      case AttributeType::kFloat:
        takes = "int_value or float_value";
        break;
      case AttributeType::kTimestamp:
        takes = "int_value (microseconds since the Unix epoch) or keyword (an "
                "RFC 3339 date-time such as \"2023-05-01T00:00:00Z\")";
        break;
      case AttributeType::kKeyword:
      case AttributeType::kKeywordList:
        takes = "keyword";
        break;
    }
    return Invalid(where_, absl::StrCat(test, ": attribute \"", column_.name,
                                        "\" has type ",
                                        AttributeTypeName(column_.type),
                                        ", which takes ", takes, ", not ",
                                        Describe(value)));
  }

  // `value` as a bound of this numeric column.
  absl::StatusOr<Bound> BoundOf(const AttributeValue& value, bool inclusive,
                                absl::string_view test) const {
    Bound bound;
    bound.set = true;
    bound.inclusive = inclusive;
    const auto kind = value.value_case();
    switch (column_.type) {
      case AttributeType::kInteger:
        if (kind != AttributeValue::kIntValue) return WrongType(value, test);
        bound.i = value.int_value();
        return bound;
      case AttributeType::kFloat:
        if (kind == AttributeValue::kIntValue) {
          bound.f = static_cast<double>(value.int_value());
        } else if (kind == AttributeValue::kFloatValue &&
                   !std::isnan(value.float_value())) {
          bound.f = value.float_value();
        } else {
          return WrongType(value, test);
        }
        return bound;
      case AttributeType::kTimestamp:
        if (kind == AttributeValue::kIntValue) {
          bound.i = value.int_value();
          return bound;
        }
        if (kind == AttributeValue::kKeyword) {
          if (std::optional<int64_t> micros =
                  ParseTimestampMicros(value.keyword())) {
            bound.i = *micros;
            return bound;
          }
        }
        return WrongType(value, test);
      case AttributeType::kKeyword:
      case AttributeType::kKeywordList:
        break;
    }
    return WrongType(value, test);
  }

  absl::Status AddEqual(const AttributeValue& value, absl::string_view test,
                        RowBitmap& rows) const {
    if (!IsNumeric(column_.type)) {
      if (value.value_case() != AttributeValue::kKeyword) {
        return WrongType(value, test);
      }
      const int64_t k = column_.FindKeyword(value.keyword());
      if (k >= 0) {
        for (int64_t row : column_.Postings(k)) SetRow(row, rows);
      }
      return absl::OkStatus();
    }
    absl::StatusOr<Bound> bound = BoundOf(value, true, test);
    if (!bound.ok()) return bound.status();
    AddBetween(*bound, *bound, rows);
    return absl::OkStatus();
  }

  absl::Status AddRange(const knnd::v1::Range& range, RowBitmap& rows) const {
    Bound lo;
    Bound hi;
    if (absl::Status s = RangeBounds(range, lo, hi); !s.ok()) return s;
    AddBetween(lo, hi, rows);
    return absl::OkStatus();
  }

  // The bounds of `range` on this column, into `lo` and `hi`.
  absl::Status RangeBounds(const knnd::v1::Range& range, Bound& lo,
                           Bound& hi) const {
    if (!IsNumeric(column_.type)) {
      return Invalid(where_, absl::StrCat("range: attribute \"", column_.name,
                                          "\" has type ",
                                          AttributeTypeName(column_.type),
                                          "; ranges apply to integer, float "
                                          "and timestamp attributes"));
    }
    if (range.has_gt() && range.has_gte()) {
      return Invalid(where_, absl::StrCat("range on \"", column_.name,
                                          "\" sets both gt and gte"));
    }
    if (range.has_lt() && range.has_lte()) {
      return Invalid(where_, absl::StrCat("range on \"", column_.name,
                                          "\" sets both lt and lte"));
    }
    struct Side {
      bool has;
      const AttributeValue& value;
      bool inclusive;
      const char* name;
      Bound& out;
    };
    for (const Side& side :
         {Side{range.has_gt(), range.gt(), false, "range.gt", lo},
          Side{range.has_gte(), range.gte(), true, "range.gte", lo},
          Side{range.has_lt(), range.lt(), false, "range.lt", hi},
          Side{range.has_lte(), range.lte(), true, "range.lte", hi}}) {
      if (!side.has) continue;
      absl::StatusOr<Bound> bound = BoundOf(side.value, side.inclusive, side.name);
      if (!bound.ok()) return bound.status();
      side.out = *bound;
    }
    if (!lo.set && !hi.set) {
      return Invalid(where_, absl::StrCat("range on \"", column_.name,
                                          "\" sets no bound (gt, gte, lt or "
                                          "lte)"));
    }
    return absl::OkStatus();
  }

  // Rows whose value lies between `lo` and `hi` (either may be unset).
  void AddBetween(const Bound& lo, const Bound& hi, RowBitmap& rows) const {
    if (column_.type == AttributeType::kFloat) {
      AddSorted(column_.sorted_floats, lo, hi, lo.f, hi.f, rows);
    } else {
      AddSorted(column_.sorted_ints, lo, hi, lo.i, hi.i, rows);
    }
  }

  // The values of `sorted` (the column's, ascending) between `lo` and
  // `hi`, as [begin, end).
  template <typename T>
  std::pair<const T*, const T*> Between(const T* sorted, const Bound& lo,
                                        const Bound& hi, T lo_value,
                                        T hi_value) const {
    const T* begin = sorted;
    const T* end = sorted + column_.count;
    if (lo.set) {
      begin = lo.inclusive ? std::lower_bound(begin, end, lo_value)
                           : std::upper_bound(begin, end, lo_value);
    }
    if (hi.set) {
      end = hi.inclusive ? std::upper_bound(begin, end, hi_value)
                         : std::lower_bound(begin, end, hi_value);
    }
    return {begin, end};
  }

  template <typename T>
  void AddSorted(const T* sorted, const Bound& lo, const Bound& hi, T lo_value,
                 T hi_value, RowBitmap& rows) const {
    const auto [begin, end] = Between(sorted, lo, hi, lo_value, hi_value);
    if (end - begin > column_.count / 2) {
      // Most of the column: setting its complement is cheaper, a bit per
      // row outside the range (1M rows at 99%: ~1 ms a request the other
      // way, bench/RESULTS.md "Filters"). Rows without a value stay out.
      RowBitmap outside(rows.size());
      const T* last = sorted + column_.count;
      for (const T* it = sorted; it < begin; ++it) {
        SetRow(column_.sorted_rows[it - sorted], outside);
      }
      for (const T* it = end; it < last; ++it) {
        SetRow(column_.sorted_rows[it - sorted], outside);
      }
      rows.OrWordsExcept(column_.presence, outside);
      return;
    }
    for (const T* it = begin; it < end; ++it) {
      SetRow(column_.sorted_rows[it - sorted], rows);
    }
  }

  // A row read from the mapped file: one outside the index (a file
  // changed after it was checked) is never set.
  void SetRow(int64_t row, RowBitmap& rows) const {
    if (row >= 0 && row < rows.size()) rows.Set(row);
  }

  const AttributeStore::Column& column_;
  const std::string where_;
};

absl::StatusOr<RowBitmap> CompileAt(const Filter& filter,
                                    const std::string& where,
                                    const AttributeStore& store) {
  switch (filter.expression_case()) {
    case Filter::kCondition: {
      const Condition& condition = filter.condition();
      const std::string at = absl::StrCat(where, ".condition");
      if (condition.field().empty()) {
        return Invalid(at, "field is empty; name an attribute");
      }
      const AttributeStore::Column* column = store.Find(condition.field());
      if (column == nullptr) {
        std::vector<std::string> names;
        for (const AttributeStore::Column& c : store.columns()) {
          names.push_back(c.name);
        }
        return Invalid(at, absl::StrCat("unknown attribute \"",
                                        condition.field(),
                                        "\"; the index has: ",
                                        absl::StrJoin(names, ", ")));
      }
      return ColumnCompiler(*column, at).Compile(condition);
    }
    case Filter::kAllOf:
    case Filter::kAnyOf: {
      const bool all = filter.expression_case() == Filter::kAllOf;
      const auto& list = all ? filter.all_of() : filter.any_of();
      const std::string name = absl::StrCat(where, all ? ".all_of" : ".any_of");
      std::optional<RowBitmap> rows;
      for (int i = 0; i < list.filters_size(); ++i) {
        absl::StatusOr<RowBitmap> part =
            CompileAt(list.filters(i), absl::StrCat(name, "[", i, "]"), store);
        if (!part.ok()) return part.status();
        if (!rows.has_value()) {
          rows = std::move(*part);
        } else if (all) {
          rows->And(*part);
        } else {
          rows->Or(*part);
        }
      }
      return std::move(*rows);
    }
    case Filter::kNegate: {
      absl::StatusOr<RowBitmap> rows =
          CompileAt(filter.negate(), absl::StrCat(where, ".negate"), store);
      if (rows.ok()) rows->Invert();
      return rows;
    }
    case Filter::EXPRESSION_NOT_SET:
      break;
  }
  return Invalid(where, "sets none of condition, all_of, any_of and negate");
}

}  // namespace

namespace {

// The checks every filter passes before any row is touched.
absl::Status CheckFilter(const Filter& filter, const AttributeStore* store,
                         const FilterLimits& limits) {
  int64_t conditions = 0;
  int depth = 0;
  if (absl::Status s = Measure(filter, "filter", 1, conditions, depth);
      !s.ok()) {
    return s;
  }
  if (conditions > limits.max_conditions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "filter has ", conditions,
        " conditions and in-list values, more than max_filter_conditions=",
        limits.max_conditions));
  }
  if (depth > limits.max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("filter is nested ", depth,
                     " deep, more than max_filter_depth=", limits.max_depth));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "filter on attribute \"", FirstField(filter),
        "\": the index has no attributes (build it with knnctl build "
        "--attributes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RowBitmap> CompileFilter(const Filter& filter,
                                        const AttributeStore* store,
                                        const FilterLimits& limits) {
  if (absl::Status s = CheckFilter(filter, store, limits); !s.ok()) return s;
  return CompileAt(filter, "filter", *store);
}

absl::StatusOr<std::optional<ColumnRange>> CompileColumnRange(
    const Filter& filter, const AttributeStore* store,
    const FilterLimits& limits) {
  if (filter.expression_case() != Filter::kCondition) return std::nullopt;
  const Condition& condition = filter.condition();
  if (condition.test_case() != Condition::kEq &&
      condition.test_case() != Condition::kRange) {
    return std::nullopt;
  }
  if (absl::Status s = CheckFilter(filter, store, limits); !s.ok()) return s;
  const AttributeStore::Column* column = store->Find(condition.field());
  // Another column (or none): the bitmap's compiler says what is wrong.
  if (column == nullptr || !IsNumeric(column->type)) return std::nullopt;
  return ColumnCompiler(*column, "filter.condition").CompileRange(condition);
}

}  // namespace knnd
