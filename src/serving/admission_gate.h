// AdmissionGate: the semaphore in front of the workers. A request is admitted
// only while the query rows AND the estimated bytes in flight (queued or
// searching) stay within their budgets, and (with max_queue_time) while the
// work already admitted would keep the workers busy for at most that long;
// otherwise it is refused at once, so that neither the queue, nor memory,
// nor the time an admitted request waits can grow without bound under
// overload. The work of a request is its "work units" (query rows x
// nprobe) times the worker time per unit the gate has measured (RecordWork,
// an exponentially weighted mean), divided among the workers.
//
// Ownership: TryAdmit() hands out a move-only Ticket that holds the
// request's share; destroying the Ticket gives it back.
// Thread-safety: all methods are safe to call concurrently.
#ifndef KNND_SERVING_ADMISSION_GATE_H_
#define KNND_SERVING_ADMISSION_GATE_H_

#include <algorithm>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knnd/monitoring/reject_reason.h"

namespace knnd {

class AdmissionGate {
 public:
  struct Options {
    // Query rows admitted at once. Must be > 0.
    int64_t max_inflight_queries = 4096;
    // Estimated bytes admitted at once. 0: unbounded. Changed later with
    // SetMaxInflightBytes() (the budget follows the served index's heap).
    int64_t max_inflight_bytes = int64_t{1} << 30;
    // Longest estimated wait for the workers a new request may face: the
    // work in flight / num_workers. 0: unbounded. Nothing is refused for it
    // before the first RecordWork, nor while nothing is in flight.
    absl::Duration max_queue_time = absl::ZeroDuration();
    int num_workers = 1;
  };

  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    // Gives the share back early; idempotent.
    void Release();

   private:
    friend class AdmissionGate;
    Ticket(AdmissionGate* gate, int64_t queries, int64_t bytes, double work_ns)
        : gate_(gate), queries_(queries), bytes_(bytes), work_ns_(work_ns) {}
    AdmissionGate* gate_ = nullptr;
    int64_t queries_ = 0;
    int64_t bytes_ = 0;
    double work_ns_ = 0;
  };

  explicit AdmissionGate(const Options& options)
      : options_(options),
        workers_(std::max(options.num_workers, 1)),
        max_bytes_(options.max_inflight_bytes) {}

  // Admits `queries` rows needing an estimated `bytes`, or says why not:
  //   UNAVAILABLE         the gate is draining (shutdown has begun)
  //   INVALID_ARGUMENT    the request alone exceeds a budget (never fits)
  //   RESOURCE_EXHAUSTED  the budgets are full now; retry later
  // On failure `*reason` (if given) is set.
  absl::StatusOr<Ticket> TryAdmit(int64_t queries, int64_t bytes,
                                  RejectReason* reason = nullptr) {
    return TryAdmitWork(queries, bytes, 0, reason);
  }
  // As TryAdmit, for a request of `work_units`; also
  //   RESOURCE_EXHAUSTED  (kQueueTime) the estimated wait for the workers
  //                       exceeds max_queue_time
  absl::StatusOr<Ticket> TryAdmitWork(int64_t queries, int64_t bytes,
                                      int64_t work_units,
                                      RejectReason* reason = nullptr);

  // A finished request of `work_units` kept the workers busy for
  // `worker_time` (summed over the workers it ran on): updates the
  // measured time per unit.
  void RecordWork(int64_t work_units, absl::Duration worker_time);
  // The estimated wait for the workers now (work in flight / num_workers).
  absl::Duration EstimatedQueueTime() const;

  // From now on every TryAdmit fails with UNAVAILABLE.
  void StartDraining();
  bool draining() const;

  // Blocks until nothing is in flight or `deadline`; true when idle.
  bool WaitUntilIdle(absl::Time deadline);

  // Sets the byte budget (0: unbounded). Requests already admitted keep
  // their share; a lower budget only refuses new requests until enough is
  // released.
  void SetMaxInflightBytes(int64_t bytes);
  int64_t max_inflight_bytes() const;

  int64_t queries_in_flight() const;
  int64_t bytes_in_flight() const;
  // The options as given; max_inflight_bytes() is the budget in force.
  const Options& options() const { return options_; }

 private:
  void Release(int64_t queries, int64_t bytes, double work_ns);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queries_ == 0;
  }

  const Options options_;
  const int workers_;  // num_workers, at least 1
  mutable absl::Mutex mu_;
  int64_t queries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_bytes_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  double work_ns_ ABSL_GUARDED_BY(mu_) = 0;      // estimated, in flight
  double ns_per_unit_ ABSL_GUARDED_BY(mu_) = 0;  // 0 until measured
};

}  // namespace knnd

#endif  // KNND_SERVING_ADMISSION_GATE_H_
