// knnctl shard: an index built whole split into shards sharing its
// quantizers (index/index_sharding.h, docs/sharding.md).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "build_outputs.h"
#include "command.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/monitoring/build_info.h"

namespace knnd::knnctl {
namespace {

struct ShardOptions {
  std::string index;
  std::string output;
  int shards = 0;
};

int Shard(const ShardOptions& options) {
  if (options.index.empty() || options.shards <= 0) {
    return Fail("shard needs --index INDEX and --shards N");
  }
  const std::string& output =
      options.output.empty() ? options.index : options.output;
  if (access(DirectoryOf(output).c_str(), W_OK) != 0) {
    return Fail(absl::StrCat("cannot write into the directory of ", output,
                             ": ", std::strerror(errno)));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<ShardSpec>> plan =
      ShardIndexFile(options.index, options.shards, output,
                     absl::StrCat("knnctl shard: ", BuildInfoLine()));
  if (!plan.ok()) return Fail(plan.status());
  for (const ShardSpec& shard : *plan) {
    PrintShardWritten(ShardPath(output, shard.shard_id, shard.shard_count),
                      shard);
  }
  std::printf(
      "split %s into %d shards in %.1f s; tune the set as one (knnctl "
      "tune --index %s --shards %d), then serve each with its own knnd and "
      "merge with knnd --shard_targets (docs/sharding.md)\n",
      options.index.c_str(), options.shards,
      absl::ToDoubleSeconds(absl::Now() - start), output.c_str(),
      options.shards);
  return kExitOk;
}

}  // namespace

std::function<int()> DefineShard(FlagSet& flags) {
  auto options = std::make_shared<ShardOptions>();
  flags.Add("index", &options->index, "INDEX",
            "knnd FastScan index file to split (with its sidecar and "
            "vectors file, when it has them). Required.");
  flags.Add("shards", &options->shards, "N",
            "Number of shards, 1 to 256: shard S holds the S-th range of "
            "ids (equal counts). Required.");
  flags.Add("output", &options->output, "PATH",
            "Shard S is written to PATH.shard-S-of-N (with .meta.json, "
            ".vectors, .ids and .payloads when the index has them); "
            "default: the --index path.");
  return [options] { return Shard(*options); };
}

}  // namespace knnd::knnctl
