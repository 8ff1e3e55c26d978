// ShardSetSearch: the shards of one split (index_sharding.h) loaded
// together and searched as one index, for measuring the set as a front
// serves it (knnctl tune --shards). A search asks every shard in turn on
// the calling thread, with re-ranking for its candidates and their PQ
// estimates, and merges the answers in the front's order
// (shard_merge_order.h). The shards share their quantizers, so the merged
// answer is the unsharded index's (docs/sharding.md, "The split").
// Serving a set is the front's (rpc/shard_front.h): this runs in one
// process, and its queries/s is the set's CPU per query, every shard's
// time added.
//
// Ownership: owns the shards' snapshots. Thread-safety: immutable after
// Load(); Search() is const and may run on any number of threads.
#ifndef KNND_INDEX_SHARD_SET_SEARCH_H_
#define KNND_INDEX_SHARD_SET_SEARCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/faiss/search_args.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {

class ShardSetSearch final : public MeasuredIndex {
 public:
  // Loads the `count` shards PATH.shard-S-of-N (ShardPath) with `options`.
  // INVALID_ARGUMENT when count is outside [1, kMaxShards];
  // FAILED_PRECONDITION naming the file when a shard's sidecar does not
  // say it is shard S of `count` of the build of shard 0, or its dim,
  // metric or nlist differ from shard 0's.
  static absl::StatusOr<std::unique_ptr<ShardSetSearch>> Load(
      const std::string& path, int count, const LoadOptions& options);

  // Shard 0's, but for path (PATH), ntotal (the set's), has_vectors (every
  // shard has them) and shard_id (0) with shard_count the set's size.
  const IndexInfo& info() const override { return info_; }
  // Plain searches only (no allowed_ids, filters or return_candidates:
  // INVALID_ARGUMENT); results as one knnd's, padded with id -1 and +inf
  // (L2) or -inf.
  absl::Status Search(const SearchArgs& args) const override;
  // Rows of the set are the shards' rows in shard order (the rows of the
  // input `knnctl build --shards` split).
  int64_t IdOfRow(int64_t row) const override;

  int count() const { return static_cast<int>(shards_.size()); }
  const std::string& shard_path(int s) const { return paths_[s]; }
  const IndexSnapshot& shard(int s) const { return *shards_[s]; }

 private:
  ShardSetSearch() = default;

  IndexInfo info_;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<IndexSnapshot>> shards_;
  // first_row_[s]: the set's row of shard s's row 0; one more entry, the
  // set's ntotal.
  std::vector<int64_t> first_row_;
};

}  // namespace knnd

#endif  // KNND_INDEX_SHARD_SET_SEARCH_H_
