// The version policy: which index version a reload serves, as pure functions
// over plain values, so that every rule can be tested with a table instead
// of threads and files. IndexManager keeps a VersionRecord under its mutex,
// asks the IndexSource for the wanted version, calls DecideVersion() and
// carries the decision out (loading outside its lock), then stores
// RecordAfter()'s record.
//
// The rules, in the order they apply:
//   1. The wanted version is the one the request pins, else the one pinned
//      before, else (0) the highest complete version on disk.
//   2. A pinned version still loaded for rollback (retained) is the target
//      even when its files are gone; otherwise the source must name it.
//   3. The target already serving (same version and file) is kept as is.
//   4. A retained target is published again, without a load.
//   5. A target refused before is not loaded again by a plain reload (the
//      poll would otherwise retry it every interval); asking for a version
//      (pin or unpin) tries it again.
//   6. Otherwise the target is loaded, checked and published.
//
// Thread-safety: the functions only read their arguments; the types are
// plain values with no synchronisation of their own.
#ifndef KNND_LIFECYCLE_VERSION_POLICY_H_
#define KNND_LIFECYCLE_VERSION_POLICY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "knnd/lifecycle/index_source.h"

namespace knnd {

// What the manager knows of its versions between reloads.
struct VersionRecord {
  IndexVersion serving;        // version 0: none serves
  int64_t pinned_version = 0;  // 0: follow the latest
  // The last version refused (0: none) and the error its reload returned.
  int64_t refused_version = 0;
  absl::Status refused_status;
};

// What one reload is asked to do.
struct VersionRequest {
  // Reload(): serve the pinned version, else the latest; the pin stays.
  static VersionRequest Reload() { return {}; }
  // ReloadVersion(version > 0): pin `version` and serve it (rollback).
  static VersionRequest Pin(int64_t version) { return {version}; }
  // ReloadVersion(0): drop the pin and serve the latest again.
  static VersionRequest Unpin() { return {int64_t{0}}; }

  // Absent: keep the current pin; 0: unpin; N > 0: pin N.
  absl::optional<int64_t> pin;
};

// Everything DecideVersion() looks at.
struct VersionPolicyInput {
  VersionRecord record;
  // The versions loaded and kept for rollback, most recent first.
  std::vector<IndexVersion> retained;
  VersionRequest request;
  // The source's answer for WantedVersion(record, request): IndexSource::
  // Find(N) for N > 0, IndexSource::Latest() for 0.
  absl::StatusOr<IndexVersion> found;
};

struct VersionDecision {
  enum class Action {
    kNoTarget,      // the source names no target; `status` says why
    kKeep,          // `target` already serves
    kRepublish,     // `target` is retained: publish it again, no load
    kStillRefused,  // `target` was refused before; `status` is that refusal
    kLoad,          // load, check and publish `target`
  };
  Action action = Action::kNoTarget;
  IndexVersion target;  // all actions but kNoTarget
  absl::Status status;  // kNoTarget and kStillRefused
};

// Same version number and same index file.
bool SameVersion(const IndexVersion& a, const IndexVersion& b);

// The version a reload wants: the one pinned by the request or before it;
// 0 for the highest complete one.
int64_t WantedVersion(const VersionRecord& record,
                      const VersionRequest& request);

// What a reload does (rules 2 to 6 above).
VersionDecision DecideVersion(const VersionPolicyInput& input);

// The error of a reload whose load of `target` failed with `load_status`:
// the same code, naming the version, its file, the reason and the version
// still serving (0: none).
absl::Status LoadRefusal(const IndexVersion& target,
                         const absl::Status& load_status,
                         int64_t serving_version);

// The record after `decision` for `request` was carried out with `result`
// (OK, or the error the reload returns): a published target serves and is
// no longer refused, the request's pin holds once it succeeded, and a
// failed target is remembered as refused unless it already was.
VersionRecord RecordAfter(const VersionRecord& before,
                          const VersionRequest& request,
                          const VersionDecision& decision,
                          const absl::Status& result);

// The record after the serving `version` was withdrawn for `reason`: none
// serves, and the version is refused.
VersionRecord RecordAfterWithdrawal(const VersionRecord& before,
                                    int64_t version,
                                    const absl::Status& reason);

}  // namespace knnd

#endif  // KNND_LIFECYCLE_VERSION_POLICY_H_
