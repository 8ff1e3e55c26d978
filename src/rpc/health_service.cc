#include "knnd/rpc/health_service.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace knnd {
namespace {

using grpc::health::v1::HealthCheckResponse;

constexpr char kShuttingDown[] = "knnd is shutting down";

}  // namespace

// One Watch stream. Writes go out one at a time; a change that comes while
// one is in flight is sent after it (only the latest status: a watcher
// wants the current state, not the history). No lock is held while calling
// into gRPC.
//
// Before its request is matched the stream owns itself (deleted if the
// server shuts down first); once matched, HealthService::watches_ owns it
// until its finish and done events are both back.
class HealthService::WatchStream final {
 public:
  WatchStream(HealthService* service, const ServingQueue& queue)
      : service_(service),
        queue_(queue),
        writer_(&context_),
        request_tag_(this, &WatchStream::OnRequest),
        write_tag_(this, &WatchStream::OnWriteDone),
        finish_tag_(this, &WatchStream::OnFinished),
        done_tag_(this, &WatchStream::OnDoneEvent) {
    queue_.calls->Add();
  }

  // Posts the request for the next Watch on `queue_`.
  void Post() {
    PostTag(&done_tag_);
    PostTag(&request_tag_);
    context_.AsyncNotifyWhenDone(&done_tag_);
    service_->service_.RequestWatch(&context_, &request_, &writer_, queue_.cq,
                                    queue_.cq, &request_tag_);
  }

  // The first answer, or the Finish of a stream opened after EndWatches().
  void Begin(ServingStatus status, int64_t generation, bool end) {
    if (end) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
      return;
    }
    Update(status, generation);
  }

  const std::string& name() const { return request_.service(); }

  // `status` as of SetServing() call number `generation`.
  void Update(ServingStatus status, int64_t generation) {
    ServingStatus send;
    {
      absl::MutexLock lock(&mu_);
      if (generation < generation_) return;  // older than what it has
      generation_ = generation;
      latest_ = status;
      if (writing_ || finishing_ || (has_sent_ && sent_ == status)) return;
      send = StartWriteLocked();
    }
    Write(send);
  }

  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      end_status_ = status;
      end_requested_ = true;
      if (writing_) return;  // OnWriteDone() finishes
      finishing_ = true;
    }
    Finish(status);
  }

 private:
  void OnRequest(bool ok) {
    if (!ok) {  // the server is shutting down; no other event comes
      CallCount* const calls = queue_.calls;
      delete this;
      calls->Remove();
      return;
    }
    (new WatchStream(service_, queue_))->Post();
    service_->Watch(std::shared_ptr<WatchStream>(this));
  }

  void OnWriteDone(bool ok) {
    enum { kNothing, kWrite, kFinish } next = kNothing;
    grpc::Status finish_status;
    ServingStatus write_status = HealthCheckResponse::UNKNOWN;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !end_requested_) {
        // The stream broke (client gone); the done event follows.
        end_requested_ = true;
        end_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
      }
      if (end_requested_ && !finishing_) {
        finishing_ = true;
        finish_status = end_status_;
        next = kFinish;
      } else if (!finishing_ && latest_ != sent_) {
        write_status = StartWriteLocked();
        next = kWrite;
      }
    }
    if (next == kWrite) Write(write_status);
    if (next == kFinish) Finish(finish_status);
  }

  // Sends `status` (as StartWriteLocked chose it) / ends the stream. The
  // message is this call's own: gRPC serializes it within Write(), and the
  // next write, started by whichever thread takes this one's event, builds
  // its own (a member rewritten there would be ordered after this read
  // only through gRPC core, which ThreadSanitizer does not see).
  void Write(ServingStatus status) {
    HealthCheckResponse response;
    response.set_status(status);
    PostTag(&write_tag_);
    writer_.Write(response, &write_tag_);
  }
  // Held until Finish() returns, as UnaryMethod's calls are: it reads the
  // context after PostTag(), and the events that free the stream may be
  // taken on another thread meanwhile.
  void Finish(const grpc::Status& status) {
    events_.fetch_add(1, std::memory_order_relaxed);
    PostTag(&finish_tag_);
    writer_.Finish(status, &finish_tag_);
    Unref();
  }

  void OnDoneEvent(bool /*ok*/) {
    if (context_.IsCancelled()) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
    Unref();
  }

  void OnFinished(bool /*ok*/) { Unref(); }

  // The finish and done events both back (and Finish() returned): nothing
  // of gRPC's refers to the stream any more, and it starts no operation
  // (Update() and End() see it finishing). Forget() may delete it.
  void Unref() {
    if (events_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      CallCount* const calls = queue_.calls;
      service_->Forget(this);
      calls->Remove();
    }
  }

  // Marks a write of latest_ begun; returns the status to send.
  ServingStatus StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    has_sent_ = true;
    sent_ = latest_;
    return latest_;
  }

  HealthService* const service_;
  const ServingQueue queue_;
  grpc::ServerContext context_;
  grpc::health::v1::HealthCheckRequest request_;
  grpc::ServerAsyncWriter<HealthCheckResponse> writer_;
  MemberTag<WatchStream> request_tag_;
  MemberTag<WatchStream> write_tag_;
  MemberTag<WatchStream> finish_tag_;
  MemberTag<WatchStream> done_tag_;
  // Finish and done, once matched, and one more while Finish() runs.
  std::atomic<int> events_{2};
  absl::Mutex mu_;
  ServingStatus latest_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = -1;
  ServingStatus sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool has_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool end_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

HealthService::HealthService(const std::vector<std::string>& services,
                             CallHold* hold)
    : hold_(hold),
      services_(services.begin(), services.end()),
      check_(&service_, &Async::RequestCheck,
             [this](CheckCall* call) { Check(call); }) {
  services_.insert("");
}

void HealthService::Listen(const ServingQueue& queue) {
  check_.Listen(queue);
  (new WatchStream(this, queue))->Post();
}

HealthService::~HealthService() = default;

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& service) const {
  if (services_.count(service) == 0) return HealthCheckResponse::SERVICE_UNKNOWN;
  const bool serving = service.empty() ? overall_serving_ : serving_;
  return serving ? HealthCheckResponse::SERVING
                 : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetStatuses(bool services_serving, bool overall_serving) {
  std::vector<std::pair<std::shared_ptr<WatchStream>, ServingStatus>> tell;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    serving_ = services_serving;
    overall_serving_ = overall_serving;
    generation = ++generation_;
    for (const std::shared_ptr<WatchStream>& watch : watches_) {
      tell.emplace_back(watch, StatusLocked(watch->name()));
    }
  }
  for (auto& [watch, status] : tell) watch->Update(status, generation);
}

void HealthService::EndWatches() {
  std::vector<std::shared_ptr<WatchStream>> end;
  {
    absl::MutexLock lock(&mu_);
    watches_ended_ = true;
    end.assign(watches_.begin(), watches_.end());
  }
  const grpc::Status status(grpc::StatusCode::UNAVAILABLE, kShuttingDown);
  for (const std::shared_ptr<WatchStream>& watch : end) watch->End(status);
}

void HealthService::Forget(WatchStream* watch) {
  std::shared_ptr<WatchStream> last;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = watches_.begin(); it != watches_.end(); ++it) {
    if (it->get() == watch) {
      last = *it;
      watches_.erase(it);
      break;
    }
  }
}

HealthService::ServingStatus HealthService::StatusOf(
    const std::string& service) const {
  absl::MutexLock lock(&mu_);
  return StatusLocked(service);
}

void HealthService::Check(CheckCall* call) {
  const grpc::health::v1::HealthCheckRequest& request = call->request();
  const ServingStatus status = StatusOf(request.service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    call->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("unknown service \"", request.service(),
                     "\"; known: \"", absl::StrJoin(services_, "\", \""),
                     "\"")));
    return;
  }
  call->response()->set_status(status);
  if (hold_ != nullptr &&
      hold_->Hold(absl::FromChrono(call->context()->deadline()),
                  [call] { call->Finish(grpc::Status::OK); })) {
    return;
  }
  call->Finish(grpc::Status::OK);
}

void HealthService::Watch(const std::shared_ptr<WatchStream>& watch) {
  ServingStatus status;
  int64_t generation;
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked(watch->name());
    generation = generation_;
    ended = watches_ended_;
    // Registered even when ended: its last event (after the Finish below)
    // looks for it, and it keeps the stream alive until then.
    watches_.insert(watch);
  }
  watch->Begin(status, generation, ended);
}

}  // namespace knnd
