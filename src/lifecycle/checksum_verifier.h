// ChecksumVerifier: the background checksum check of ChecksumCheck::
// kBackground. The first version is published with its structure checked but
// its files not yet read whole, so that time to SERVING does not grow with
// the file; this class then reads them once on a thread of its own and
// hands the outcome to its owner, which withdraws the version on a mismatch.
//
// Its states: not started -> reading -> read (a load may read files again)
// -> done (the owner has acted on the outcome). At most one check runs in a
// manager's life.
//
// Ownership: shares the snapshot it reads until the check ends; owns its
// thread, which the destructor joins after cancelling the read.
// Thread-safety: all methods are safe to call concurrently; the callback
// runs on the check's thread with no lock of this class held.
#ifndef KNND_LIFECYCLE_CHECKSUM_VERIFIER_H_
#define KNND_LIFECYCLE_CHECKSUM_VERIFIER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knnd/index/index_snapshot.h"

namespace knnd {

class ChecksumVerifier {
 public:
  // Receives the outcome: OK, CANCELLED (the verifier is being destroyed),
  // or why the version is to be withdrawn, naming it and its file.
  using Callback = std::function<void(const absl::Status& outcome)>;

  ChecksumVerifier() = default;
  ~ChecksumVerifier();
  ChecksumVerifier(const ChecksumVerifier&) = delete;
  ChecksumVerifier& operator=(const ChecksumVerifier&) = delete;

  // Starts reading `snapshot`'s files; `on_outcome` runs on the check's
  // thread once they are read. Call at most once.
  void Start(std::shared_ptr<const IndexSnapshot> snapshot,
             Callback on_outcome);
  bool started() const;

  // Returns once no file is being read for the check: none was started,
  // its read finished, or Cancel() was called. One whole-file read of an
  // index at a time, so that a load does not compete with the check for
  // the disk and the page cache.
  void AwaitRead() const;

  // Waits until `deadline` for the check to be done and returns its
  // outcome: OK when it passed or none was started, DEADLINE_EXCEEDED while
  // it still runs, else the callback's outcome.
  absl::Status AwaitDone(absl::Time deadline) const;

  // Stops a read in progress (the outcome is then CANCELLED) or one yet to
  // start, and releases AwaitRead().
  void Cancel();

 private:
  void Check(const std::shared_ptr<const IndexSnapshot>& snapshot,
             const Callback& on_outcome);

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);  // once done_
  // Read by VerifyChecksums() between reads, without mu_.
  std::atomic<bool> cancel_{false};
  std::thread thread_;
};

}  // namespace knnd

#endif  // KNND_LIFECYCLE_CHECKSUM_VERIFIER_H_
