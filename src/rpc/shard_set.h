// Whether the targets a front polls are the shards of one index (rule 1 of
// docs/sharding.md), decided from what each last answered to
// GetIndexInfo: a pure function, so that the front's poller and the
// fuzzer (tests/fuzz/shard_answers_fuzzer.cc) check the same thing. Every
// value in a poll comes from the network, so none is trusted as an index.
//
// Thread-safety: a pure function.
#ifndef KNND_RPC_SHARD_SET_H_
#define KNND_RPC_SHARD_SET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// What the poller last learned of one target.
struct PolledShard {
  std::string target;
  const absl::Status* polled = nullptr;  // the poll's outcome; `info` is
                                        // read only when it is OK
  const knnd::v1::GetIndexInfoResponse* info = nullptr;
};

// OK when the targets are the `shards.size()` shards of one index: each a
// shard (not a whole index) of a set of that size, with a shard_id inside
// it and no id served twice, of one dim and metric, and every one still
// holding the lowest version any of them serves (serving it, or kept), those
// serving it of one build. Else UNAVAILABLE naming every problem and its
// target.
absl::Status CheckShardSet(const std::vector<PolledShard>& shards);

}  // namespace knnd

#endif  // KNND_RPC_SHARD_SET_H_
