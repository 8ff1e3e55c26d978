#include "knnd/lifecycle/checksum_verifier.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace knnd {

ChecksumVerifier::~ChecksumVerifier() {
  Cancel();
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void ChecksumVerifier::Start(std::shared_ptr<const IndexSnapshot> snapshot,
                             Callback on_outcome) {
  const IndexInfo& info = snapshot->info();
  spdlog::info(
      "index version {} serves before its checksums are "
      "verified; reading {} in the background to verify them",
      info.version,
      absl::StrCat(info.path,
                   info.has_vectors ? " and " + info.vectors_path : "",
                   info.has_id_table ? " and " + info.id_table_path : "",
                   info.has_payloads ? " and " + info.payloads_path : "",
                   info.has_attributes ? " and " + info.attributes_path : "",
                   info.text_field.empty() ? "" : " and " + info.text_path));
  absl::MutexLock lock(&mu_);
  started_ = true;
  thread_ = std::thread(
      [this, snapshot = std::move(snapshot),
       on_outcome = std::move(on_outcome)] { Check(snapshot, on_outcome); });
}

bool ChecksumVerifier::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

void ChecksumVerifier::Check(
    const std::shared_ptr<const IndexSnapshot>& snapshot,
    const Callback& on_outcome) {
  const IndexInfo& info = snapshot->info();
  const absl::Time start = absl::Now();
  absl::Status status = snapshot->VerifyChecksums(&cancel_);
  {
    absl::MutexLock lock(&mu_);
    read_ = true;  // a load waiting for it may go on
  }
  if (status.ok()) {
    spdlog::info("index version {} ({}): checksums verified in the "
                 "background in {:.1f} ms",
                 info.version, info.path,
                 absl::ToDoubleMilliseconds(absl::Now() - start));
  } else if (!absl::IsCancelled(status)) {
    status = absl::Status(
        status.code(),
        absl::StrCat("index version ", info.version, " (", info.path,
                     ") withdrawn: it served from start-up until its "
                     "checksum check failed: ",
                     status.message()));
  }
  on_outcome(status);
  absl::MutexLock lock(&mu_);
  done_ = true;
  outcome_ = status;
}

void ChecksumVerifier::AwaitRead() const {
  absl::MutexLock lock(&mu_);
  auto read = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !started_ || read_ || cancel_.load();
  };
  mu_.Await(absl::Condition(&read));
}

absl::Status ChecksumVerifier::AwaitDone(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !started_ || done_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        "the background checksum check is still running");
  }
  return outcome_;
}

void ChecksumVerifier::Cancel() {
  // Under mu_, so that AwaitRead() sees it.
  absl::MutexLock lock(&mu_);
  cancel_.store(true);
}

}  // namespace knnd
