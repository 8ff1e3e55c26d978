#include "knnd/rpc/shard_set.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace knnd {

using knnd::v1::GetIndexInfoResponse;

namespace {

// Problems of the versions: every shard still has the set's version (the
// lowest any serves), serving or kept, and those serving it are of one
// build. Mid-rollout the shards serve different versions (and builds).
void CheckVersions(const std::vector<PolledShard>& shards,
                   std::vector<std::string>& problems) {
  int64_t version = std::numeric_limits<int64_t>::max();
  for (const PolledShard& shard : shards) {
    version = std::min(version, shard.info->version());
  }
  const PolledShard* at_version = nullptr;
  for (const PolledShard& shard : shards) {
    const GetIndexInfoResponse& info = *shard.info;
    const bool kept = std::find(info.retained_versions().begin(),
                                info.retained_versions().end(),
                                version) != info.retained_versions().end();
    if (info.version() != version && !kept) {
      problems.push_back(absl::StrCat(
          "target ", shard.target, " serves version ", info.version(),
          " and no longer has version ", version,
          ", which other shards serve (keep_previous_versions keeps it "
          "while the set rolls forward)"));
    } else if (info.version() == version) {
      if (at_version == nullptr) {
        at_version = &shard;
      } else if (info.shard().build_id() !=
                 at_version->info->shard().build_id()) {
        problems.push_back(absl::StrCat(
            "targets ", at_version->target, " and ", shard.target,
            " serve version ", version, " of different builds (",
            at_version->info->shard().build_id(), ", ",
            info.shard().build_id(), ")"));
      }
    }
  }
}

}  // namespace

absl::Status CheckShardSet(const std::vector<PolledShard>& shards) {
  const size_t n = shards.size();
  std::vector<std::string> problems;
  // owner[id]: the index in `shards` of the target serving shard id.
  std::vector<int> owner(n, -1);
  const PolledShard* first = nullptr;
  for (size_t i = 0; i < n; ++i) {
    const PolledShard& shard = shards[i];
    if (!shard.polled->ok()) {
      problems.push_back(absl::StrCat("target ", shard.target, ": ",
                                      shard.polled->message()));
      continue;
    }
    const knnd::v1::ShardInfo& info = shard.info->shard();
    if (info.shard_count() == 0) {
      problems.push_back(absl::StrCat("target ", shard.target,
                                      " serves a whole index, not a shard"));
      continue;
    }
    if (info.shard_count() != n) {
      problems.push_back(absl::StrCat("target ", shard.target, " is shard ",
                                      info.shard_id(), " of ",
                                      info.shard_count(), ", not of ", n));
      continue;
    }
    if (info.shard_id() >= n) {
      problems.push_back(absl::StrCat(
          "target ", shard.target, " reports shard_id ", info.shard_id(),
          " of a set of ", n, ", outside [0, ", n, ")"));
      continue;
    }
    int& serving = owner[info.shard_id()];
    if (serving >= 0) {
      problems.push_back(absl::StrCat("targets ", shards[serving].target,
                                      " and ", shard.target,
                                      " both serve shard ", info.shard_id()));
      continue;
    }
    serving = static_cast<int>(i);
    if (first == nullptr) {
      first = &shard;
    } else if (shard.info->dim() != first->info->dim() ||
               shard.info->metric() != first->info->metric()) {
      problems.push_back(absl::StrCat(
          "target ", shard.target, " (dim ", shard.info->dim(),
          ") and target ", first->target, " (dim ", first->info->dim(),
          ") are not shards of one index"));
    }
  }
  if (problems.empty()) CheckVersions(shards, problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the shard set is not ready: ",
                                             absl::StrJoin(problems, "; ")));
}

}  // namespace knnd
