#include "knnd/rpc/async_call.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace knnd {

void CompletionQueueThreads::Add(
    std::unique_ptr<grpc::ServerCompletionQueue> cq) {
  queues_.push_back(std::move(cq));
}

namespace {

// The next event of `cq`, polled for `poll` before blocking; false once the
// queue is shut down and drained. With a zero deadline AsyncNext never
// sleeps: it takes an event already on the queue or, when no other thread
// is waiting in gRPC's poller, reads the sockets itself.
bool NextEvent(grpc::ServerCompletionQueue* cq, absl::Duration poll,
               const std::function<bool()>& may_poll,
               std::atomic<int64_t>* blocking_waits, void** tag, bool* ok) {
  if (poll > absl::ZeroDuration() && (!may_poll || may_poll())) {
    const gpr_timespec zero = gpr_time_0(GPR_CLOCK_MONOTONIC);
    const absl::Time until = absl::Now() + poll;
    do {
      switch (cq->AsyncNext(tag, ok, zero)) {
        case grpc::CompletionQueue::GOT_EVENT:
          return true;
        case grpc::CompletionQueue::SHUTDOWN:
          return false;
        case grpc::CompletionQueue::TIMEOUT:
          break;
      }
    } while (absl::Now() < until);
  }
  blocking_waits->fetch_add(1, std::memory_order_relaxed);
  return cq->Next(tag, ok);
}

}  // namespace

void CompletionQueueThreads::Start(const char* name, int threads_per_queue,
                                   int poll_us,
                                   std::function<bool()> may_poll) {
  const std::string thread_name = std::string(name).substr(0, 15);
  const absl::Duration poll = absl::Microseconds(std::max(0, poll_us));
  for (int i = 0; i < std::max(1, threads_per_queue); ++i) {
    for (const auto& queue : queues_) {
      grpc::ServerCompletionQueue* cq = queue.get();
      threads_.emplace_back([this, cq, thread_name, poll, may_poll] {
        pthread_setname_np(pthread_self(), thread_name.c_str());
        void* tag = nullptr;
        bool ok = false;
        while (NextEvent(cq, poll, may_poll, &blocking_waits_, &tag, &ok)) {
          TakeTag(tag);
          static_cast<CqTag*>(tag)->Proceed(ok);
        }
      });
    }
  }
}

void CompletionQueueThreads::Shutdown() {
  if (queues_.empty()) return;
  calls_.AwaitNone();
  for (const auto& queue : queues_) queue->Shutdown();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  // Queues never started (no threads) hold nothing: nothing was posted.
  for (const auto& queue : queues_) {
    void* tag = nullptr;
    bool ok = false;
    while (queue->Next(&tag, &ok)) {
      TakeTag(tag);
      static_cast<CqTag*>(tag)->Proceed(ok);
    }
  }
  queues_.clear();
}

UnaryCallBase::~UnaryCallBase() {
  if (on_done_) on_done_();
}

void UnaryCallBase::OnCancel(std::function<void()> on_cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      on_cancel_ = std::move(on_cancel);
      return;
    }
  }
  if (cancelled()) on_cancel();
}

void UnaryCallBase::OnDone(std::function<void()> on_done) {
  on_done_ = std::move(on_done);
}

void UnaryCallBase::Done() {
  // gRPC's contract: IsCancelled() is valid once the done event is back.
  const bool cancelled = context_.IsCancelled();
  cancelled_.store(cancelled, std::memory_order_release);
  std::function<void()> on_cancel;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    on_cancel = std::move(on_cancel_);
  }
  if (cancelled && on_cancel) on_cancel();
}

}  // namespace knnd
