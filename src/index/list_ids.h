// ListIds: how the numbers an index's inverted lists hold (list ids)
// relate to the rows of its per-vector files (the raw vectors of
// vectors_file.h, the id table of id_table.h) and to the ids its answers
// carry (shared/DESIGN.md, "Corpus data model").
//
//   index                          row of list id l    id of list id l
//   row ids, whole                 l                   l
//   row ids, shard [first, end)    l - first           l
//   own ids (id table), whole      l                   table[l]
//   own ids, shard of rows         l - first           table[l - first]
//     [first, end)
//
// A shard's lists keep the row numbers of the whole index, so every shard
// of a set and the unsharded index number a vector alike.
//
// Ownership: borrows the id table, which must outlive it (the snapshot
// owns both). Thread-safety: immutable; any number of threads may use it.
#ifndef KNND_INDEX_LIST_IDS_H_
#define KNND_INDEX_LIST_IDS_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/types/span.h"
#include "knnd/storage/id_table.h"

namespace knnd {

class ListIds {
 public:
  // Row ids of a whole index: list id == row == id.
  ListIds() = default;
  // `count` rows whose list ids start at `first`; `table` (null: none)
  // holds their ids.
  ListIds(int64_t first, int64_t count, const IdTable* table)
      : first_(first), count_(count), table_(table) {}

  bool has_table() const { return table_ != nullptr; }

  // The row of list id `list_id`, or -1 when this index has none.
  int64_t RowOf(int64_t list_id) const {
    if (list_id < 0) return -1;
    const int64_t row = list_id - first_;
    return row >= 0 && row < count_ ? row : -1;
  }
  // The id of `row` (0 <= row < count).
  int64_t IdOfRow(int64_t row) const {
    return table_ == nullptr ? row + first_ : table_->IdOf(row);
  }
  // The id answers carry for `list_id`; -1 for a missing one (-1) or one
  // outside the index.
  int64_t IdOf(int64_t list_id) const {
    if (table_ == nullptr) return list_id;
    const int64_t row = RowOf(list_id);
    return row < 0 ? -1 : table_->IdOf(row);
  }

  // The row holding the answer id `id`, or -1 when this index has none.
  int64_t RowOfId(int64_t id) const {
    return table_ == nullptr ? RowOf(id) : table_->RowOf(id);
  }

  // With an id table: the list ids of the ids of `sorted_ids` this index
  // holds, ascending; the ids absent from it are dropped. When none is
  // held: {-1}, a list no vector matches (an empty list means no filter).
  // Without a table the ids are the list ids: returned as they are.
  std::vector<int64_t> ListIdsOf(absl::Span<const int64_t> sorted_ids) const;

  // Answers of `num_queries` queries of `k` (list ids, sorted by distance)
  // turned into ids in place, equal distances ordered by ascending id, as a
  // merger of shards orders them. Without a table: unchanged.
  void ToAnswerIds(int64_t num_queries, int k, const float* distances,
                   int64_t* ids) const;

 private:
  int64_t first_ = 0;
  int64_t count_ = std::numeric_limits<int64_t>::max();
  const IdTable* table_ = nullptr;
};

}  // namespace knnd

#endif  // KNND_INDEX_LIST_IDS_H_
