// Canary check of a new index version before it is published: a small,
// fixed set of queries must find at least `min_recall` of their reference
// neighbours in the new version, or the version is refused and the old one
// keeps serving. It catches the broken builds that file checks cannot: ids
// shuffled, vectors from another embedding model, a quantizer trained on
// the wrong data.
//
// The reference neighbours are either a ground-truth file (exact answers,
// ids stable across versions) or, without one, the answers of the version
// serving now searched exhaustively (nprobe = its nlist: the best answers
// it can give). The new version is searched as clients will search it, at
// the serving nprobe. recall@k = |new top-k intersect reference top-k| /
// |reference top-k| averaged over the queries (padding ids -1 excluded).
//
// Thread-safety: a CanarySet is immutable once loaded; CheckCanary() only
// reads the snapshots, which are themselves safe to search concurrently.
#ifndef KNND_INDEX_CANARY_H_
#define KNND_INDEX_CANARY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vector_io.h"

namespace knnd {

// Most queries a canary set may hold: the check searches them twice per
// reload, once exhaustively.
inline constexpr int64_t kMaxCanaryQueries = 10000;

struct CanarySet {
  Matrix queries;
  // Reference neighbour ids, one row per query; rows == 0 when none was
  // given (the serving version's answers are the reference then).
  IdMatrix ground_truth;
};

// Reads the queries (any format ReadVectors() reads) and the optional
// ground truth (ReadIds(); `ground_truth_path` may be empty). Errors name
// the file and the limit: no rows, more than kMaxCanaryQueries, or a ground
// truth whose rows differ from the queries'.
absl::StatusOr<CanarySet> LoadCanarySet(const std::string& queries_path,
                                        const std::string& ground_truth_path);

struct CanaryOptions {
  int k = 10;
  double min_recall = 0.5;
  // nprobe of the new version's search (the serving default nprobe).
  int nprobe = 1;
};

// Runs `search` to completion, e.g. on a worker of the pool so that FAISS
// runs with the workers' thread settings; returns its status.
using CanaryRunner = std::function<absl::Status(std::function<absl::Status()>)>;

// Checks `candidate` against the reference (the set's ground truth, else
// `serving` searched exhaustively). Returns the recall; an error when it is
// below min_recall (FAILED_PRECONDITION naming both), when the dimensions
// differ, or when there is no reference (no ground truth and `serving` is
// null: callers skip the check then).
absl::StatusOr<double> CheckCanary(const CanarySet& set,
                                   const IndexSnapshot& candidate,
                                   const IndexSnapshot* serving,
                                   const CanaryOptions& options,
                                   const CanaryRunner& run);

}  // namespace knnd

#endif  // KNND_INDEX_CANARY_H_
