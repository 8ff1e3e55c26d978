#include "knnd/lifecycle/version_preparation.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace knnd {

absl::StatusOr<std::unique_ptr<VersionPreparation>> VersionPreparation::Create(
    const Options& options, WorkerPool* pool, const IndexHolder* holder) {
  std::unique_ptr<CanarySet> canary;
  if (!options.canary_queries_path.empty()) {
    absl::StatusOr<CanarySet> set = LoadCanarySet(
        options.canary_queries_path, options.canary_ground_truth_path);
    if (!set.ok()) return set.status();
    spdlog::info("canary check: {} queries from {}, recall@{} >= {} against {}",
                 set->queries.rows, options.canary_queries_path,
                 options.canary_k, options.canary_min_recall,
                 options.canary_ground_truth_path.empty()
                     ? std::string("the serving version searched exhaustively")
                     : options.canary_ground_truth_path);
    canary = std::make_unique<CanarySet>(*std::move(set));
  }
  return std::unique_ptr<VersionPreparation>(
      new VersionPreparation(options, std::move(canary), pool, holder));
}

absl::Status VersionPreparation::Prepare(const IndexSnapshot& snapshot) const {
  if (absl::Status s = WarmUp(snapshot); !s.ok()) return s;
  return CheckCanaryOf(snapshot);
}

absl::Status VersionPreparation::RunOnWorker(
    const std::function<absl::Status()>& work) const {
  absl::Status status;
  absl::Notification done;
  pool_->Submit([&] {
    status = work();
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// Seeded random queries through the same path as requests (a worker, the
// default nprobe and refine_factor) so that the first requests meet warm
// code and caches.
absl::Status VersionPreparation::WarmUp(const IndexSnapshot& snapshot) const {
  const int n = options_.warmup_queries;
  if (n == 0) return absl::OkStatus();
  const IndexInfo& info = snapshot.info();
  const SearchLimits limits = ResolveLimits(options_.limits, info);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> queries(static_cast<size_t>(n) * info.dim);
  for (float& v : queries) v = normal(rng);
  const int k = 10;
  std::vector<float> distances(static_cast<size_t>(n) * k);
  std::vector<int64_t> ids(static_cast<size_t>(n) * k);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = k;
  args.nprobe =
      options_.warmup_nprobe > 0
          ? std::min(options_.warmup_nprobe, static_cast<int>(info.nlist))
          : limits.default_nprobe;
  args.refine_factor = limits.default_refine_factor;
  args.distances = distances.data();
  args.ids = ids.data();
  const absl::Time start = absl::Now();
  absl::Status status = RunOnWorker([&] { return snapshot.Search(args); });
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("warm-up search failed: ",
                                                    status.message()));
  }
  spdlog::info("warm-up: {} queries at nprobe {} in {:.1f} ms", n, args.nprobe,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status VersionPreparation::CheckCanaryOf(
    const IndexSnapshot& snapshot) const {
  if (canary_ == nullptr) return absl::OkStatus();
  // The version serving now (the reference without a ground truth): the
  // candidate is published only after this check.
  std::shared_ptr<const IndexSnapshot> serving = holder_->Pin();
  if (canary_->ground_truth.rows == 0 && serving == nullptr) {
    if (canary_->queries.dim != snapshot.info().dim) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "canary queries %s have dim=%d, the index dim=%d",
          options_.canary_queries_path, canary_->queries.dim,
          snapshot.info().dim));
    }
    spdlog::info("canary check skipped for version {}: no version serving "
                 "to compare with and no ground truth",
                 snapshot.info().version);
    return absl::OkStatus();
  }
  CanaryOptions options;
  options.k = options_.canary_k;
  options.min_recall = options_.canary_min_recall;
  options.nprobe = ResolveLimits(options_.limits, snapshot.info()).default_nprobe;
  const absl::Time start = absl::Now();
  absl::StatusOr<double> recall =
      CheckCanary(*canary_, snapshot, serving.get(), options,
                  [this](std::function<absl::Status()> work) {
                    return RunOnWorker(work);
                  });
  if (!recall.ok()) return recall.status();
  spdlog::info(
      "canary check of version {}: recall@{} = {:.4f} >= {} in {:.1f} ms",
      snapshot.info().version, options.k, *recall, options.min_recall,
      absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace knnd
