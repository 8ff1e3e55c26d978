#include "knnd/monitoring/reject_reason.h"

namespace knnd {

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kMemoryBudget:
      return "memory_budget";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kTooLarge:
      return "too_large";
    case RejectReason::kQueueTime:
      return "queue_time";
    case RejectReason::kInvalid:
      return "invalid";
    case RejectReason::kDeadline:
      return "deadline";
    case RejectReason::kNotReady:
      return "not_ready";
  }
  return "unknown";
}

}  // namespace knnd
