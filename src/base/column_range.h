// ColumnRange: an attribute filter that is one range or eq condition on a
// numeric column (index/attribute_filter.h CompileColumnRange), kept as its
// bounds over the mapped column instead of compiled into a RowBitmap. A
// search tests a row only when it needs to (the FastScan kernel: a
// candidate that beats the heap's k-th distance), so a wide range costs
// two binary searches per request instead of a bit per admitted row
// (bench/RESULTS.md "Filters").
//
// A row matches when it holds a value (its presence bit) and the value
// lies within the bounds; NaN lies within none. This is what the bitmap
// compiled from the column's sorted values admits.
//
// Ownership: borrows the mapped column (AttributeStore::Column), which must
// outlive it: the search's pinned snapshot holds it. Thread-safety:
// immutable; any number of threads may call it.
#ifndef KNND_BASE_COLUMN_RANGE_H_
#define KNND_BASE_COLUMN_RANGE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace knnd {

struct ColumnRange {
  int64_t rows = 0;                    // the column's (the index's) rows
  const uint64_t* presence = nullptr;  // bit r % 64 of word r / 64
  // Values per row: ints for integer and timestamp columns, else floats.
  const int64_t* ints = nullptr;
  const double* floats = nullptr;
  // The bounds; an unset one is the type's lowest or highest, inclusive.
  int64_t lo_int = std::numeric_limits<int64_t>::min();
  int64_t hi_int = std::numeric_limits<int64_t>::max();
  double lo_float = -std::numeric_limits<double>::infinity();
  double hi_float = std::numeric_limits<double>::infinity();
  bool lo_inclusive = true;
  bool hi_inclusive = true;
  // The matching rows, `matched` of them, in the column's value order: a
  // slice of its sorted rows, found by two binary searches.
  const int64_t* matched_rows = nullptr;
  int64_t matched = 0;

  // False for a row outside [0, rows).
  bool Test(int64_t row) const {
    if (row < 0 || row >= rows) return false;
    if (((presence[row >> 6] >> (row & 63)) & 1) == 0) return false;
    return ints != nullptr ? Within(ints[row], lo_int, hi_int)
                           : Within(floats[row], lo_float, hi_float);
  }

  // Test() without a branch that depends on the row: its presence bit and
  // value are always read (row 0's for a row outside a non-empty column),
  // so that a loop testing many rows issues their reads, cache misses at
  // random rows of a large column, without waiting for one to decide the
  // next.
  bool TestWithoutBranches(int64_t row) const {
    if (rows <= 0) return false;  // no row 0 to read instead
    const bool inside =
        static_cast<uint64_t>(row) < static_cast<uint64_t>(rows);
    const int64_t r = inside ? row : 0;
    const bool present = (presence[r >> 6] >> (r & 63)) & 1;
    const bool within = ints != nullptr ? Within(ints[r], lo_int, hi_int)
                                        : Within(floats[r], lo_float, hi_float);
    return inside & present & within;
  }

  // The matching rows, ascending, each plus `offset` (the exact plan's
  // list ids; it takes few rows).
  std::vector<int64_t> Rows(int64_t offset = 0) const {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(matched));
    for (int64_t i = 0; i < matched; ++i) {
      // A row outside the column (a file changed after it was checked)
      // never matches, as the bitmap never sets it.
      const int64_t row = matched_rows[i];
      if (row >= 0 && row < rows) out.push_back(row + offset);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

 private:
  // Both bounds compared, without a branch on the first's outcome.
  template <typename T>
  bool Within(T value, T lo, T hi) const {
    const bool above = lo_inclusive ? value >= lo : value > lo;
    const bool below = hi_inclusive ? value <= hi : value < hi;
    return above & below;
  }
};

}  // namespace knnd

#endif  // KNND_BASE_COLUMN_RANGE_H_
