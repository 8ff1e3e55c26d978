#include "knnd/index/shard_set_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "knnd/index/index_sharding.h"
#include "knnd/index/shard_merge_order.h"

namespace knnd {
namespace {

// One candidate of one query from one shard.
struct Entry {
  float approx;
  float exact;
  int64_t id;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardSetSearch>> ShardSetSearch::Load(
    const std::string& path, int count, const LoadOptions& options) {
  if (count < 1 || count > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards=", count, " is outside [1, ", kMaxShards, "]"));
  }
  std::unique_ptr<ShardSetSearch> set(new ShardSetSearch());
  set->first_row_.push_back(0);
  for (int s = 0; s < count; ++s) {
    const std::string shard_path = ShardPath(path, s, count);
    absl::StatusOr<std::unique_ptr<IndexSnapshot>> shard =
        IndexSnapshot::Load(shard_path, options);
    if (!shard.ok()) return shard.status();
    const IndexInfo& info = (*shard)->info();
    if (info.shard_count != count || info.shard_id != s) {
      return absl::FailedPreconditionError(absl::StrCat(
          shard_path, " is ",
          info.shard_count == 0
              ? std::string("a whole index, not a shard")
              : absl::StrCat("shard ", info.shard_id, " of ", info.shard_count),
          " by its sidecar; shard ", s, " of ", count, " of ", path,
          " was expected (knnctl build --shards, knnctl shard)"));
    }
    if (s > 0) {
      const IndexInfo& first = set->shards_.front()->info();
      if (info.build_id != first.build_id) {
        return absl::FailedPreconditionError(
            absl::StrCat(shard_path, " is of build ", info.build_id, " but ",
                         set->paths_.front(), " of build ", first.build_id,
                         ": the shards of one set come from one split"));
      }
      if (info.dim != first.dim || info.metric != first.metric ||
          info.nlist != first.nlist) {
        return absl::FailedPreconditionError(
            absl::StrCat(shard_path, " has dim ", info.dim, ", metric ",
                         MetricName(info.metric), " and nlist ", info.nlist,
                         " but ", set->paths_.front(), " ", first.dim, ", ",
                         MetricName(first.metric), " and ", first.nlist));
      }
    }
    set->first_row_.push_back(set->first_row_.back() + info.ntotal);
    set->paths_.push_back(shard_path);
    set->shards_.push_back(std::move(*shard));
  }
  set->info_ = set->shards_.front()->info();
  set->info_.path = path;
  set->info_.ntotal = set->first_row_.back();
  set->info_.shard_id = 0;
  set->info_.shard_count = count;
  for (const auto& shard : set->shards_) {
    set->info_.has_vectors =
        set->info_.has_vectors && shard->info().has_vectors;
  }
  return set;
}

absl::Status ShardSetSearch::Search(const SearchArgs& args) const {
  if (!args.allowed_ids.empty() || FiltersRows(args) ||
      args.return_candidates) {
    return absl::InvalidArgumentError(
        "a shard set is measured with plain searches: no allowed_ids, "
        "filters or return_candidates");
  }
  const int k = args.k;
  const int refine = args.refine_factor;
  const int64_t num_queries = args.num_queries;
  // Each shard's answer, as it sends it to a front: with re-ranking every
  // candidate with its estimate and exact distance.
  SearchArgs shard_args = args;
  shard_args.return_candidates = refine > 0;
  shard_args.rerank_time = nullptr;
  const int width = ResultWidth(shard_args);
  const size_t n = static_cast<size_t>(num_queries) * width;
  std::vector<std::vector<int64_t>> ids(shards_.size(),
                                        std::vector<int64_t>(n));
  std::vector<std::vector<float>> exact(shards_.size(), std::vector<float>(n));
  std::vector<std::vector<float>> approx(
      shards_.size(), std::vector<float>(refine > 0 ? n : 0));
  for (size_t s = 0; s < shards_.size(); ++s) {
    shard_args.ids = ids[s].data();
    shard_args.distances = exact[s].data();
    shard_args.approx_distances = refine > 0 ? approx[s].data() : nullptr;
    if (absl::Status status = shards_[s]->Search(shard_args); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(paths_[s], ": ", status.message()));
    }
  }
  const bool ascending = info_.metric == Metric::kL2;
  const float pad = ascending ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::infinity();
  std::vector<Entry> entries;
  for (int64_t q = 0; q < num_queries; ++q) {
    entries.clear();
    for (size_t s = 0; s < shards_.size(); ++s) {
      for (int j = 0; j < width; ++j) {
        const size_t at = static_cast<size_t>(q) * width + j;
        const float distance = exact[s][at];
        const float estimate = refine > 0 ? approx[s][at] : distance;
        // As the front: a padding or NaN entry is a missing result.
        if (ids[s][at] < 0 || std::isnan(distance) || std::isnan(estimate)) {
          continue;
        }
        entries.push_back(Entry{estimate, distance, ids[s][at]});
      }
    }
    const size_t keep = MergeOrder(entries, k, refine, ascending);
    for (int j = 0; j < k; ++j) {
      const int64_t out = q * k + j;
      const bool found = static_cast<size_t>(j) < keep;
      args.ids[out] = found ? entries[j].id : -1;
      args.distances[out] = found ? entries[j].exact : pad;
    }
  }
  return absl::OkStatus();
}

int64_t ShardSetSearch::IdOfRow(int64_t row) const {
  // The last shard whose first row is <= row.
  const auto next =
      std::upper_bound(first_row_.begin(), first_row_.end() - 1, row);
  const size_t s = static_cast<size_t>(next - first_row_.begin()) - 1;
  return shards_[s]->IdOfRow(row - first_row_[s]);
}

}  // namespace knnd
