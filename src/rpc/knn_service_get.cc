// KnnServiceImpl::Get: the records of given ids (index/get_records.h),
// admitted as a Search is (the token, the version pinned, the deadline,
// the gate with the answer's bytes) but answered on the calling thread:
// it reads a few mapped rows per id and never searches, so it needs no
// worker.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/index/get_records.h"
#include "knnd/rpc/knn_service.h"
#include "knnd/rpc/search_payloads.h"
#include "spdlog/spdlog.h"

namespace knnd {

void KnnServiceImpl::Get(GetCall* call) {
  const absl::Time arrival = absl::Now();
  const SearchAdmission::Answer answer = [call, arrival, metrics = metrics_](
                                             const absl::Status& status) {
    if (!status.ok() && spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("Get from {} failed: {}", call->peer(), status.ToString());
    }
    metrics->RecordRpc(Metrics::Rpc::kGet, call->protocol(), status.code(),
                       absl::Now() - arrival);
    call->Answer(status);
  };
  if (!admission_.Authorize(*call, answer, kGetMethod)) return;
  const knnd::v1::GetRequest& request = call->request();
  Pinned pinned;
  RejectReason reason = RejectReason::kInvalid;
  if (absl::Status s =
          PinVersion(call, request.index_version(), &pinned, &reason);
      !s.ok()) {
    return admission_.Refuse(reason, s, answer);
  }
  const IndexSnapshot& snapshot = *pinned.snapshot;
  absl::optional<PayloadSelection> payloads;
  if (request.has_payloads()) {
    absl::StatusOr<PayloadSelection> selection =
        SelectRequested(request.payloads(), snapshot);
    if (!selection.ok()) {
      return admission_.Refuse(RejectReason::kInvalid, selection.status(),
                               answer);
    }
    payloads = std::move(*selection);
  }
  const RecordsAsk ask{payloads.has_value() ? &*payloads : nullptr,
                       request.with_attributes(), request.with_vectors()};
  if (absl::Status s = CheckRecordsAsk(snapshot, ask); !s.ok()) {
    return admission_.Refuse(RejectReason::kInvalid, s, answer);
  }
  const SearchLimits limits = ResolveLimits(options_.limits, snapshot.info());
  absl::StatusOr<RecordsPlan> plan = PlanRecords(
      snapshot,
      absl::Span<const int64_t>(request.ids().data(), request.ids().size()),
      ask, limits.max_get_ids);
  if (!plan.ok()) {
    return admission_.Refuse(RejectReason::kInvalid, plan.status(), answer);
  }
  // The two version fields beside the records.
  const int64_t bytes = plan->answer_bytes + 22;
  if (bytes > options_.max_send_message_bytes) {
    return admission_.Refuse(
        RejectReason::kTooLarge,
        absl::ResourceExhaustedError(absl::StrCat(
            "the answer to Get of ", request.ids_size(), " ids would be ",
            bytes, " bytes, more than max_send_message_bytes=",
            options_.max_send_message_bytes,
            "; ask for fewer ids, fewer payload fields or no vectors")),
        answer);
  }
  absl::StatusOr<AdmissionGate::Ticket> ticket =
      admission_.Admit(*call, arrival, call->deadline(), {1, bytes, 0}, answer);
  if (!ticket.ok()) return;
  knnd::v1::GetResponse* response = call->response();
  FillRecords(snapshot, ask, *plan, response);
  response->set_index_version(snapshot.info().version);
  response->set_serving_version(pinned.serving_version);
  if (payloads.has_value()) {
    int64_t payload_bytes = 0;
    for (int64_t b : plan->payload_bytes) payload_bytes += b;
    metrics_->RecordPayloadBytes(payload_bytes);
  }
  answer(absl::OkStatus());
}

}  // namespace knnd
