// VersionPreparation: what runs on a loaded index version before it is
// published (the index manager's `prepare` step): warm-up queries through
// the same path as requests, then the canary check when one is configured.
// A failure keeps the version from serving; the version serving now, if
// any, goes on.
//
// Ownership: owns the canary set; borrows the worker pool and the holder,
// which outlive it.
// Thread-safety: Prepare() may be called from any thread (the index
// manager's); the object is immutable after Create.
#ifndef KNND_LIFECYCLE_VERSION_PREPARATION_H_
#define KNND_LIFECYCLE_VERSION_PREPARATION_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/index/canary.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/serving/index_holder.h"
#include "knnd/serving/search_limits.h"
#include "knnd/serving/worker_pool.h"

namespace knnd {

class VersionPreparation {
 public:
  struct Options {
    // Seeded random queries run before publishing; 0: none.
    int warmup_queries = 16;
    // nprobe of the warm-up queries; 0: the default nprobe requests get.
    int warmup_nprobe = 1;
    // The request limits, for the default nprobe and refine_factor.
    LimitsConfig limits;
    // Canary: queries (empty: no canary), optional ground truth, k and the
    // recall the new version must reach.
    std::string canary_queries_path;
    std::string canary_ground_truth_path;
    int canary_k = 10;
    double canary_min_recall = 0.5;
  };

  // Reads the canary set, when configured (errors name the file).
  static absl::StatusOr<std::unique_ptr<VersionPreparation>> Create(
      const Options& options, WorkerPool* pool, const IndexHolder* holder);

  // Warm-up, then the canary check; the first error, with its reason.
  absl::Status Prepare(const IndexSnapshot& snapshot) const;

 private:
  VersionPreparation(const Options& options, std::unique_ptr<CanarySet> canary,
                     WorkerPool* pool, const IndexHolder* holder)
      : options_(options),
        canary_(std::move(canary)),
        pool_(pool),
        holder_(holder) {}

  absl::Status WarmUp(const IndexSnapshot& snapshot) const;
  absl::Status CheckCanaryOf(const IndexSnapshot& snapshot) const;
  // Runs `work` on a worker of the pool (FAISS with the workers' thread
  // settings) and waits for it.
  absl::Status RunOnWorker(const std::function<absl::Status()>& work) const;

  const Options options_;
  const std::unique_ptr<const CanarySet> canary_;  // null without a canary
  WorkerPool* const pool_;
  const IndexHolder* const holder_;
};

}  // namespace knnd

#endif  // KNND_LIFECYCLE_VERSION_PREPARATION_H_
