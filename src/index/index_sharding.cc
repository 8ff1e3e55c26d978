#include "knnd/index/index_sharding.h"

#include "absl/strings/str_cat.h"
#include "knnd/storage/version_manifest.h"

namespace knnd {

absl::StatusOr<std::vector<ShardSpec>> PlanShards(
    absl::Span<const int64_t> sorted_ids, int shards) {
  const int64_t n = static_cast<int64_t>(sorted_ids.size());
  if (shards < 1 || shards > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shards=", shards, " is outside [1, ", kMaxShards, "]"));
  }
  if (shards > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards=", shards, " exceeds the ", n,
                     " vectors of the index: a shard would be empty"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (sorted_ids[i] < 0 || (i > 0 && sorted_ids[i] <= sorted_ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the index's ids are not distinct and >= 0 (id ", sorted_ids[i],
          " at rank ", i, "); it cannot be split by id ranges"));
    }
  }
  std::vector<ShardSpec> plan(static_cast<size_t>(shards));
  for (int s = 0; s < shards; ++s) {
    plan[s].shard_id = s;
    plan[s].shard_count = shards;
    plan[s].first_id = s == 0 ? 0 : sorted_ids[s * n / shards];
    if (s > 0) plan[s - 1].end_id = plan[s].first_id;
  }
  plan.back().end_id = sorted_ids[n - 1] + 1;
  return plan;
}

std::string ShardPath(const std::string& path, int shard_id, int count) {
  return absl::StrCat(path, ".shard-", shard_id, "-of-", count);
}

std::string NewBuildId() { return NewVersionId(); }

void SetShardMetadata(const ShardSpec& shard, const std::string& build_id,
                      knnd::v1::IndexMetadata& metadata) {
  metadata.set_build_id(build_id);
  metadata.set_shard_id(static_cast<uint32_t>(shard.shard_id));
  metadata.set_shard_count(static_cast<uint32_t>(shard.shard_count));
  metadata.set_shard_first_id(shard.first_id);
  metadata.set_shard_end_id(shard.end_id);
}

}  // namespace knnd
