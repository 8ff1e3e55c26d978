#include "knnd/rpc/search_admission.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "knnd/base/saturating.h"

namespace knnd {

SearchAdmission::SearchAdmission(const Options& options, AdmissionGate* gate,
                                 Metrics* metrics,
                                 const TokenAuthenticator* auth,
                                 CallHold* hold)
    : options_(options),
      gate_(gate),
      metrics_(metrics),
      auth_(auth),
      hold_(hold) {}

bool SearchAdmission::Authorize(const ServerCallBase& call,
                                const Answer& answer,
                                absl::string_view method) const {
  absl::Status allowed = call.Authorize(*auth_, method);
  if (allowed.ok()) return true;
  answer(allowed);
  return false;
}

void SearchAdmission::Refuse(RejectReason reason, const absl::Status& status,
                             const Answer& answer) const {
  metrics_->RecordRejection(reason);
  answer(status);
}

void SearchAdmission::RefuseSaturated(const Shape& shape,
                                      const Answer& answer) const {
  Refuse(RejectReason::kTooLarge,
         absl::InvalidArgumentError(absl::StrCat(
             "request of ", shape.queries, " queries, k=", shape.k,
             ", refine_factor=", shape.refine_factor,
             shape.nprobe > 0 ? absl::StrCat(", nprobe=", shape.nprobe) : "",
             shape.payloads ? " with payloads" : "",
             " needs an estimated ", kSaturated,
             " bytes or more (the estimate overflows 64 bits), more than "
             "max_inflight_bytes=",
             gate_->max_inflight_bytes(),
             "; send fewer queries or a smaller k or refine_factor")),
         answer);
}

absl::StatusOr<AdmissionGate::Ticket> SearchAdmission::Admit(
    ServerCallBase& call, absl::Time arrival, absl::Time deadline,
    const Demand& demand, const Answer& answer) const {
  if (deadline <= arrival) {
    absl::Status late = absl::DeadlineExceededError(
        "the deadline had passed when the request arrived");
    Refuse(RejectReason::kDeadline, late, answer);
    return late;
  }
  RejectReason refused = RejectReason::kQueueFull;  // set on failure
  absl::StatusOr<AdmissionGate::Ticket> ticket = gate_->TryAdmitWork(
      demand.queries, demand.bytes, demand.work_units, &refused);
  if (ticket.ok()) return ticket;
  if (absl::IsResourceExhausted(ticket.status())) {
    call.AddTrailer(kPushbackMetadata,
                    std::to_string(options_.retry_pushback_ms));
  }
  metrics_->RecordRejection(refused);
  if (refused == RejectReason::kDraining && hold_ != nullptr &&
      hold_->Hold(deadline,
                  [answer, status = ticket.status()] { answer(status); })) {
    return ticket.status();
  }
  answer(ticket.status());
  return ticket.status();
}

}  // namespace knnd
