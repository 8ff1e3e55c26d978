// IndexManager: moves the served index from one version to the next without
// dropping a request (TF Serving's availability-preserving policy). A reload
// loads the target version beside the one serving, checks it, runs the
// caller's preparation (warm-up queries) on it and only then publishes it
// through the IndexHolder; requests that pinned the old snapshot finish on
// it, and its file is unmapped when the last of them lets go. A version that
// fails any step is refused: the old one keeps serving, the refusal is
// logged, counted (knnd_index_reloads_total{result="failed"}) and returned.
//
// The target is the highest complete version of the IndexSource, or the
// version pinned by ReloadVersion() (rollback): the version policy
// (version_policy.h, pure functions) decides, and this class carries the
// decision out. Checks beyond IndexSnapshot::Load's own: the dimension and
// the metric must be those of the first version served, since clients were
// built for them.
//
// Retention: with keep_previous_versions = N, the N versions served last
// stay loaded after a swap (their heap and mappings kept), so a rollback to
// one of them republishes it at once, without a load and without its files.
// With N = 0 (the default) a replaced version is unmapped when its last
// request ends.
//
// A swap drives the server's parts it is given (Parts): the memory budget
// checks a version's heap before the load allocates it and, once the
// version serves, sets the gate's byte budget for it; the version
// preparation warms it up and runs the canary before it is published. The
// server connects only serving_changed (health).
//
// Triggers: Reload() / ReloadVersion() return the outcome (admin RPC, tests,
// start-up); RequestReload() only wakes the manager's thread (SIGHUP, which
// must not block the signal loop); the same thread scans a versions
// directory every poll_interval when that is set. Reloads are serialised: one
// that arrives during another waits for it and then finds the target served,
// so a version is never loaded twice. A version refused once is not loaded
// again by Reload() (the poll would otherwise reload it every interval);
// ReloadVersion() tries it again.
//
// Checksums (Options::checksum_check): a version whose files carry
// checksums (the sidecar's CRC-32, the vectors header's) is verified by
// reading its files once. kBeforeServing does that before every publish.
// kBackground, the start-up default, publishes the FIRST version at once,
// with its structure checked but its files not yet read whole, so that time
// to SERVING does not grow with the file, and verifies it on a background
// thread (checksum_verifier.h); a mismatch withdraws it (requests get
// UNAVAILABLE with the reason, serving_changed(false), the version is
// marked refused). Later versions are verified before they are published,
// since the previous one serves meanwhile; a load waits for the background
// check's read to finish.
//
// Its state is three machines (see the members): the reload machine (one
// reload at a time, the manager's thread) and the version record the policy
// decides on, with the retained versions, under the manager's mutex; and
// the background checksum check, a ChecksumVerifier with its own lock.
//
// Ownership: borrows the holder and the metrics, which must outlive it; owns
// its threads, stopped and joined by the destructor.
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_LIFECYCLE_INDEX_MANAGER_H_
#define KNND_LIFECYCLE_INDEX_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/lifecycle/checksum_verifier.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/lifecycle/retained_versions.h"
#include "knnd/lifecycle/version_policy.h"
#include "knnd/lifecycle/version_preparation.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/serving/index_holder.h"
#include "knnd/serving/memory_budget.h"

namespace knnd {

class IndexManager {
 public:
  struct Options {
    // A file (version 1) or a versions directory (index_source.h).
    std::string index_path;
    // How versions are loaded; `version` and `verify_checksum` are set per
    // load (the latter from checksum_check).
    LoadOptions load;
    // Time between scans of a versions directory for a newer version; zero
    // means no polling (a plain file is never polled).
    absl::Duration poll_interval = absl::ZeroDuration();
    // Runs on a loaded, checked version after Parts::preparation and before
    // it is published; an error refuses the version. May be empty (knnd
    // sets none; a test holds a load here).
    std::function<absl::Status(const IndexSnapshot&)> prepare;
    // Previous versions kept loaded for an immediate rollback (see above).
    int keep_previous_versions = 0;
    // When checksums are verified (see above).
    enum class ChecksumCheck { kBeforeServing, kBackground, kOff };
    ChecksumCheck checksum_check = ChecksumCheck::kBackground;
    // Called with true after a version is published and with false after
    // the serving one is withdrawn, on the thread that did it. May be empty.
    std::function<void(bool serving)> serving_changed;
  };

  struct Outcome {
    int64_t version = 0;  // served after the reload
    std::string path;     // its index file
    // false: that version was already serving, or was retained and
    // republished without a load.
    bool loaded = false;
    int64_t previous_version = 0;  // served before the reload; 0: none
    int64_t pinned_version = 0;    // after the reload; 0: following the latest
  };

  // One version as ListVersions() reports it.
  struct VersionState {
    int64_t version = 0;
    std::string path;
    bool serving = false;
    bool retained = false;  // loaded, kept for rollback
    bool refused = false;   // the last attempt to serve it failed
    std::string refused_reason;
  };

  // The parts of the server a swap drives, each optional (null) and
  // borrowed (they must outlive the manager). `Parts{}` is none.
  struct Parts {
    // Before a version's heap is allocated: whether it fits beside the one
    // serving (MemoryBudget::CheckHeap, as LoadOptions::check_heap); after
    // every publish, the gate's byte budget for the version now serving
    // (MemoryBudget::SetByteBudgetFor).
    MemoryBudget* budget;
    // Before publishing: warm-up queries and the canary; a failure refuses
    // the version.
    const VersionPreparation* preparation;
  };

  static absl::StatusOr<std::unique_ptr<IndexManager>> Create(
      const Options& options, IndexHolder* holder, Metrics* metrics,
      Parts parts = {});
  ~IndexManager();
  IndexManager(const IndexManager&) = delete;
  IndexManager& operator=(const IndexManager&) = delete;

  // Serves the target version (the pinned one, else the highest complete
  // one), loading it if another is serving. An error says which version was
  // refused and why; the version serving before, if any, still serves.
  absl::StatusOr<Outcome> Reload();

  // Pins `version` and serves it (rollback); 0 unpins and serves the
  // highest complete version again. A version that cannot be served leaves
  // the pin and the served version as they were.
  absl::StatusOr<Outcome> ReloadVersion(int64_t version);

  // Asks the manager's thread to Reload() soon; returns at once. Requests
  // made while one is pending are merged.
  void RequestReload();

  // The complete versions of the source, lowest first, then retained
  // versions whose files are gone; and the version pinned (0: none).
  absl::StatusOr<std::vector<VersionState>> ListVersions() const;
  int64_t pinned_version() const;

  // Waits until `deadline` for the background checksum check of the first
  // version (kBackground) to finish, and returns its outcome: OK when it
  // passed or none was started, DEADLINE_EXCEEDED while it still runs, else
  // the reason the version was withdrawn.
  absl::Status AwaitBackgroundCheck(absl::Time deadline) const;

 private:
  // The reload machine: one reload runs at a time (the others wait for
  // `reloading` to turn false, so that no lock is held during a load), the
  // manager's thread runs one when `requested` or a poll is due, and
  // `stopping` ends the thread and the waits at destruction.
  struct ReloadState {
    bool reloading = false;
    bool requested = false;
    bool stopping = false;
  };

  // What clients were built for: the dimension and the metric of the first
  // version served (dim 0: none served yet); later versions must match.
  struct ServedShape {
    int dim = 0;
    absl::optional<Metric> metric;
  };

  IndexManager(const Options& options, IndexHolder* holder, Metrics* metrics,
               Parts parts)
      : options_(options), source_(options.index_path), holder_(holder),
        metrics_(metrics), parts_(parts),
        retained_(options.keep_previous_versions) {}

  // Reload() and ReloadVersion(): decides with the version policy, then
  // carries the decision out.
  absl::StatusOr<Outcome> ReloadTo(const VersionRequest& request);
  // Loads, checks, prepares and publishes `target`; no lock held.
  absl::Status LoadAndPublish(const IndexVersion& target);
  // Publishes `snapshot`, retaining the one it replaces when configured.
  void Publish(std::shared_ptr<const IndexSnapshot> snapshot);
  // Acts on the background check of `snapshot`: records its checksum state,
  // and withdraws it on a mismatch if it still serves.
  void OnBackgroundCheck(const std::shared_ptr<const IndexSnapshot>& snapshot,
                         const absl::Status& outcome);
  void Run();

  const Options options_;
  const IndexSource source_;
  IndexHolder* const holder_;
  Metrics* const metrics_;
  const Parts parts_;

  mutable absl::Mutex mu_;
  ReloadState reload_ ABSL_GUARDED_BY(mu_);
  // Which version serves, which is pinned, the last refused: the state the
  // version policy decides on.
  VersionRecord versions_ ABSL_GUARDED_BY(mu_);
  RetainedVersions retained_ ABSL_GUARDED_BY(mu_);
  ServedShape shape_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
  // Declared last: destroyed first, after the destructor joined thread_
  // (whose reload may start it), joining the check's thread, which calls
  // back into the members above.
  ChecksumVerifier verifier_;
};

}  // namespace knnd

#endif  // KNND_LIFECYCLE_INDEX_MANAGER_H_
