// Planning a split of one index into shards by id ranges
// (docs/sharding.md): which ids each shard holds, where its files go, and
// the sidecar fields that tie the shards of one build together. Writing
// the shard files is index_builder.h's (IndexBuilder::WriteShard,
// ShardIndexFile).
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_INDEX_SHARDING_H_
#define KNND_INDEX_INDEX_SHARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

// Most shards one index is split into (and a front merges).
inline constexpr int kMaxShards = 256;

// One shard of a set: it holds the ids first_id <= id < end_id.
struct ShardSpec {
  int shard_id = 0;
  int shard_count = 0;
  int64_t first_id = 0;
  int64_t end_id = 0;
};

// The ranges of `shards` shards over `sorted_ids` (ascending, distinct,
// >= 0): shard s starts at the id of rank s * n / shards (shard 0 at id 0)
// and ends where the next one starts (the last one after the largest id),
// so the shards hold equal counts, to one, and ids 0..n-1 give the row
// slices [s*n/shards, (s+1)*n/shards). INVALID_ARGUMENT when `shards` is
// outside [1, kMaxShards] or exceeds the number of ids (a shard would be
// empty), or the ids are not ascending, distinct and >= 0.
absl::StatusOr<std::vector<ShardSpec>> PlanShards(
    absl::Span<const int64_t> sorted_ids, int shards);

// Where shard `shard_id` of `count` of the index `path` is written:
// PATH.shard-S-of-N (with its .meta.json and .vectors beside it).
std::string ShardPath(const std::string& path, int shard_id, int count);

// A fresh identifier for a build: 16 lowercase hex digits from the clock
// and the system's random source.
std::string NewBuildId();

// Records `shard` and `build_id` in a shard's sidecar.
void SetShardMetadata(const ShardSpec& shard, const std::string& build_id,
                      knnd::v1::IndexMetadata& metadata);

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_SHARDING_H_
