// RetainedVersions: the versions the index manager keeps loaded after they
// were replaced (keep_previous_versions), so that a rollback to one of them
// republishes it at once, without a load and without its files; and the
// CRC-32 check state of every version serving or retained, so that the
// knnd_index_checksum metric is right again after a rollback.
//
// Ownership: shares the retained snapshots (their heap and mappings live as
// long as they are retained or pinned by a request).
// Thread-safety: not thread-safe; IndexManager guards it with its mutex.
#ifndef KNND_LIFECYCLE_RETAINED_VERSIONS_H_
#define KNND_LIFECYCLE_RETAINED_VERSIONS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "knnd/index/index_snapshot.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/monitoring/metrics.h"

namespace knnd {

class RetainedVersions {
 public:
  // Keeps at most `capacity` replaced versions; 0 keeps none.
  explicit RetainedVersions(int capacity) : capacity_(capacity) {}

  // `published` now serves in place of `replaced` (null: none served):
  // `replaced` is retained, most recent first, the oldest beyond the
  // capacity are let go, `published` is no longer retained, and the check
  // states of versions neither serving nor retained are forgotten.
  void Replaced(std::shared_ptr<const IndexSnapshot> replaced,
                const IndexSnapshot& published);

  // The retained snapshot of `version` (same number and file), or null.
  std::shared_ptr<const IndexSnapshot> Find(const IndexVersion& version) const;

  // The retained versions, most recent first.
  std::vector<IndexVersion> Versions() const;
  // Their snapshots, most recent first.
  std::vector<std::shared_ptr<const IndexSnapshot>> Snapshots() const {
    return {snapshots_.begin(), snapshots_.end()};
  }

  void SetChecksumState(int64_t version, Metrics::ChecksumState state);
  // kUnchecked for a version without a recorded state.
  Metrics::ChecksumState checksum_state(int64_t version) const;

 private:
  const int capacity_;
  std::deque<std::shared_ptr<const IndexSnapshot>> snapshots_;
  std::map<int64_t, Metrics::ChecksumState> checksum_states_;
};

}  // namespace knnd

#endif  // KNND_LIFECYCLE_RETAINED_VERSIONS_H_
