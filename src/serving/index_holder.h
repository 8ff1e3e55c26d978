// IndexHolder: publishes the snapshot being served. A request pins the
// current snapshot (a shared_ptr copy taken under the lock; the search runs
// without it), so a newer snapshot can be published at any time and the old
// one is unmapped when its last request lets go.
//
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_SERVING_INDEX_HOLDER_H_
#define KNND_SERVING_INDEX_HOLDER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {

class IndexHolder {
 public:
  // The snapshot serving now; null before the first Publish().
  std::shared_ptr<const IndexSnapshot> Pin() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }

  // Makes `snapshot` the one new requests pin, and `retained` (versions
  // kept loaded after a swap, most recent first) the ones PinVersion() may
  // also return. Requests running on the previous ones keep them alive
  // until they finish.
  void Publish(std::shared_ptr<const IndexSnapshot> snapshot,
               std::vector<std::shared_ptr<const IndexSnapshot>> retained = {}) {
    {
      absl::MutexLock lock(&mu_);
      current_.swap(snapshot);
      retained_.swap(retained);
      withdrawn_reason_ = absl::OkStatus();
    }
    // `snapshot` and `retained` now hold the previous ones; a last
    // reference is unmapped here, outside the lock.
  }

  // The snapshot of `version` (> 0) while one serves: the serving one when
  // it has that number, else a retained one; null when neither does.
  // `serving_version` (optional) is set to the serving version (0: none).
  std::shared_ptr<const IndexSnapshot> PinVersion(
      int64_t version, int64_t* serving_version = nullptr) const {
    absl::MutexLock lock(&mu_);
    if (serving_version != nullptr) {
      *serving_version = current_ == nullptr ? 0 : current_->info().version;
    }
    if (current_ == nullptr) return nullptr;
    if (current_->info().version == version) return current_;
    for (const auto& r : retained_) {
      if (r->info().version == version) return r;
    }
    return nullptr;
  }

  // The retained versions' numbers, most recent first.
  std::vector<int64_t> RetainedVersions() const {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> versions;
    for (const auto& r : retained_) versions.push_back(r->info().version);
    return versions;
  }

  // Stops serving the current snapshot: Pin() returns null and
  // NotServingStatus() says `reason` until the next Publish(). Returns the
  // withdrawn snapshot (null when there was none).
  std::shared_ptr<const IndexSnapshot> Withdraw(const absl::Status& reason) {
    absl::MutexLock lock(&mu_);
    withdrawn_reason_ = reason;
    return std::move(current_);
  }

  // Why Pin() returns null, as the UNAVAILABLE status a request gets:
  // nothing published yet, or the reason of Withdraw().
  absl::Status NotServingStatus() const {
    absl::MutexLock lock(&mu_);
    if (withdrawn_reason_.ok()) {
      return absl::UnavailableError("the index is not loaded yet");
    }
    return absl::UnavailableError(withdrawn_reason_.message());
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const IndexSnapshot> current_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const IndexSnapshot>> retained_
      ABSL_GUARDED_BY(mu_);
  absl::Status withdrawn_reason_ ABSL_GUARDED_BY(mu_);  // OK: none
};

}  // namespace knnd

#endif  // KNND_SERVING_INDEX_HOLDER_H_
