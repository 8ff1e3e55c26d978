#include "knnd/rpc/call_hold.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"

namespace knnd {

CallHold::~CallHold() {
  Release();
  Join();
}

void CallHold::Start() {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kOff) return;
  state_ = State::kHolding;
  timer_ = std::thread([this] { AnswerDueCalls(); });
}

void CallHold::Release() {
  std::vector<Held> held;
  {
    absl::MutexLock lock(&mu_);
    state_ = State::kReleased;
    held.swap(held_);
  }
  for (Held& h : held) h.answer();
  Join();
}

void CallHold::Join() {
  // Only Release() and the destructor join, after state_ is kReleased; the
  // timer thread never joins itself (it answers without calling Release).
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) {
    timer_.join();
  }
}

bool CallHold::Hold(absl::Time deadline, std::function<void()> answer) {
  const absl::Time answer_by = deadline - margin_;
  absl::MutexLock lock(&mu_);
  if (state_ != State::kHolding || answer_by <= absl::Now()) return false;
  held_.push_back({answer_by, std::move(answer)});
  return true;
}

bool CallHold::holding() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kHolding;
}

int CallHold::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(held_.size());
}

void CallHold::AnswerDueCalls() {
  for (;;) {
    std::vector<Held> due;
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kReleased) return;
      absl::Time next = absl::InfiniteFuture();
      for (const Held& h : held_) next = std::min(next, h.answer_by);
      // mu_ is held whenever absl::Mutex evaluates the condition.
      auto released_or_new = [this, n = held_.size()]()
                                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                   return state_ == State::kReleased ||
                                          held_.size() != n;
                                 };
      mu_.AwaitWithDeadline(absl::Condition(&released_or_new), next);
      if (state_ == State::kReleased) return;
      const absl::Time now = absl::Now();
      auto not_due = std::partition(
          held_.begin(), held_.end(),
          [now](const Held& h) { return h.answer_by > now; });
      std::move(not_due, held_.end(), std::back_inserter(due));
      held_.erase(not_due, held_.end());
    }
    for (Held& h : due) h.answer();
  }
}

}  // namespace knnd
