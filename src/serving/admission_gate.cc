#include "knnd/serving/admission_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "knnd/base/saturating.h"

namespace knnd {

AdmissionGate::Ticket& AdmissionGate::Ticket::operator=(
    Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    queries_ = std::exchange(other.queries_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    work_ns_ = std::exchange(other.work_ns_, 0);
  }
  return *this;
}

void AdmissionGate::Ticket::Release() {
  if (gate_ != nullptr) {
    std::exchange(gate_, nullptr)->Release(queries_, bytes_, work_ns_);
  }
}

absl::StatusOr<AdmissionGate::Ticket> AdmissionGate::TryAdmitWork(
    int64_t queries, int64_t bytes, int64_t work_units, RejectReason* reason) {
  auto reject = [reason](RejectReason r, absl::Status status) {
    if (reason != nullptr) *reason = r;
    return status;
  };
  if (queries > options_.max_inflight_queries) {
    return reject(RejectReason::kTooLarge,
                  absl::InvalidArgumentError(absl::StrCat(
                      "request has ", queries,
                      " queries, more than max_inflight_queries=",
                      options_.max_inflight_queries)));
  }
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return reject(RejectReason::kDraining,
                  absl::UnavailableError(
                      "knnd is shutting down (draining): retry on another "
                      "replica"));
  }
  // An estimate is never negative, and one that saturated
  // (base/saturating.h) means its inputs were out of all proportion: taken,
  // the first would lower the bytes counted in flight and the second make
  // every later sum overflow, both letting others past the budget.
  if (bytes < 0 || Saturated(bytes)) {
    return reject(RejectReason::kTooLarge,
                  absl::InvalidArgumentError(absl::StrCat(
                      "request's estimated bytes (", bytes,
                      ") are out of range [0, ", kSaturated - 1,
                      "]; send fewer queries or a smaller k")));
  }
  if (max_bytes_ > 0 && bytes > max_bytes_) {
    return reject(RejectReason::kTooLarge,
                  absl::InvalidArgumentError(absl::StrCat(
                      "request needs an estimated ", bytes,
                      " bytes, more than max_inflight_bytes=", max_bytes_,
                      "; send fewer queries or a smaller k")));
  }
  if (queries_ + queries > options_.max_inflight_queries) {
    return reject(RejectReason::kQueueFull,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "server at capacity: ", queries_, " queries in flight + ",
                      queries, " requested > max_inflight_queries=",
                      options_.max_inflight_queries)));
  }
  if (Saturated(SatAdd(bytes_, bytes)) ||
      (max_bytes_ > 0 && bytes_ + bytes > max_bytes_)) {
    return reject(RejectReason::kMemoryBudget,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "server at memory budget: ", bytes_, " bytes in flight + ",
                      bytes, " requested > max_inflight_bytes=",
                      max_bytes_)));
  }
  if (options_.max_queue_time > absl::ZeroDuration() && queries_ > 0 &&
      work_ns_ / workers_ > absl::ToDoubleNanoseconds(options_.max_queue_time)) {
    return reject(
        RejectReason::kQueueTime,
        absl::ResourceExhaustedError(absl::StrCat(
            "server queue too long: the work admitted would keep the ",
            workers_, " workers busy for ",
            absl::FormatDuration(absl::Nanoseconds(work_ns_ / workers_)),
            " (measured), more than max_queue_time_ms=",
            absl::ToInt64Milliseconds(options_.max_queue_time))));
  }
  const double work_ns = static_cast<double>(work_units) * ns_per_unit_;
  queries_ += queries;
  bytes_ += bytes;
  work_ns_ += work_ns;
  return Ticket(this, queries, bytes, work_ns);
}

void AdmissionGate::Release(int64_t queries, int64_t bytes, double work_ns) {
  absl::MutexLock lock(&mu_);
  queries_ -= queries;
  bytes_ -= bytes;
  work_ns_ = queries_ == 0 ? 0 : std::max(work_ns_ - work_ns, 0.0);
}

void AdmissionGate::RecordWork(int64_t work_units, absl::Duration worker_time) {
  if (work_units <= 0 || worker_time <= absl::ZeroDuration()) return;
  const double per_unit =
      absl::ToDoubleNanoseconds(worker_time) / static_cast<double>(work_units);
  absl::MutexLock lock(&mu_);
  // Weight 1/8 per request: a few requests follow a change of index or
  // machine load, one outlier moves it little.
  ns_per_unit_ =
      ns_per_unit_ == 0 ? per_unit : ns_per_unit_ + (per_unit - ns_per_unit_) / 8;
}

absl::Duration AdmissionGate::EstimatedQueueTime() const {
  absl::MutexLock lock(&mu_);
  return absl::Nanoseconds(work_ns_ / workers_);
}

void AdmissionGate::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool AdmissionGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool AdmissionGate::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &AdmissionGate::IdleLocked),
                               deadline);
}

void AdmissionGate::SetMaxInflightBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  max_bytes_ = bytes;
}

int64_t AdmissionGate::max_inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return max_bytes_;
}

int64_t AdmissionGate::queries_in_flight() const {
  absl::MutexLock lock(&mu_);
  return queries_;
}

int64_t AdmissionGate::bytes_in_flight() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace knnd
