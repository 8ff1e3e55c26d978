// IndexHolder: publishes the snapshot being served. A request pins the
// current snapshot (a shared_ptr copy taken under the lock; the search runs
// without it), so a newer snapshot can be published at any time and the old
// one is unmapped when its last request lets go.
//
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_INDEX_HOLDER_H_
#define KNND_INDEX_HOLDER_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "knnd/index_snapshot.h"

namespace knnd {

class IndexHolder {
 public:
  // The snapshot serving now; null before the first Publish().
  std::shared_ptr<const IndexSnapshot> Pin() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }

  // Makes `snapshot` the one new requests pin. Requests running on the
  // previous one keep it alive until they finish.
  void Publish(std::shared_ptr<const IndexSnapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      current_.swap(snapshot);
    }
    // `snapshot` now holds the previous version; if this was its last
    // reference it is unmapped here, outside the lock.
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const IndexSnapshot> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnd

#endif  // KNND_INDEX_HOLDER_H_
