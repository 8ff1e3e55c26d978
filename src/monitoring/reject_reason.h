// RejectReason: why a Search was refused before reaching the workers, the
// `reason` label of knnd_requests_rejected_total. The admission gate decides
// the first five; the handler refuses the others before asking the gate.
#ifndef KNND_MONITORING_REJECT_REASON_H_
#define KNND_MONITORING_REJECT_REASON_H_

namespace knnd {

// kNotReady stays last: Metrics sizes its counters by it.
enum class RejectReason {
  kQueueFull,
  kMemoryBudget,
  kDraining,
  kTooLarge,
  kQueueTime,  // the work queued ahead would take longer than max_queue_time_ms
  kInvalid,   // the request does not parse or breaks a limit
  kDeadline,  // the deadline had passed on arrival
  kNotReady,  // no index loaded yet
};

// The label value: "queue_full", "memory_budget", ...
const char* RejectReasonName(RejectReason reason);

}  // namespace knnd

#endif  // KNND_MONITORING_REJECT_REASON_H_
