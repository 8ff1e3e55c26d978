#include "knnd/serving/admission_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace knnd {

AdmissionGate::Ticket& AdmissionGate::Ticket::operator=(
    Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    queries_ = std::exchange(other.queries_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void AdmissionGate::Ticket::Release() {
  if (gate_ != nullptr) {
    std::exchange(gate_, nullptr)->Release(queries_, bytes_);
  }
}

absl::StatusOr<AdmissionGate::Ticket> AdmissionGate::TryAdmit(
    int64_t queries, int64_t bytes, RejectReason* reason) {
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
  if (max_bytes_ > 0 && bytes_ + bytes > max_bytes_) {
    return reject(RejectReason::kMemoryBudget,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "server at memory budget: ", bytes_, " bytes in flight + ",
                      bytes, " requested > max_inflight_bytes=",
                      max_bytes_)));
  }
  queries_ += queries;
  bytes_ += bytes;
  return Ticket(this, queries, bytes);
}

void AdmissionGate::Release(int64_t queries, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  queries_ -= queries;
  bytes_ -= bytes;
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
