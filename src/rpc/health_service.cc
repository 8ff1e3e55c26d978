#include "knnd/rpc/health_service.h"

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
// into gRPC, whose reactions may run inline on the calling thread.
class HealthService::WatchReactor final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  // The first answer, or the Finish of a stream opened after EndWatches().
  void Begin(ServingStatus status, int64_t generation, bool end) {
    if (end) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
      return;
    }
    Update(status, generation);
  }

  const std::string& name() const { return name_; }

  // `status` as of SetServing() call number `generation`.
  void Update(ServingStatus status, int64_t generation) {
    {
      absl::MutexLock lock(&mu_);
      if (generation < generation_) return;  // older than what it has
      generation_ = generation;
      latest_ = status;
      if (writing_ || finishing_ || (has_sent_ && sent_ == status)) return;
      StartWriteLocked();
    }
    StartWrite(&response_);
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

  void OnWriteDone(bool ok) override {
    enum { kNothing, kWrite, kFinish } next = kNothing;
    grpc::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !end_requested_) {
        // The stream broke (client gone); OnCancel() or OnDone() follows.
        end_requested_ = true;
        end_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
      }
      if (end_requested_ && !finishing_) {
        finishing_ = true;
        finish_status = end_status_;
        next = kFinish;
      } else if (!finishing_ && latest_ != sent_) {
        StartWriteLocked();
        next = kWrite;
      }
    }
    if (next == kWrite) StartWrite(&response_);
    if (next == kFinish) Finish(finish_status);
  }

  void OnCancel() override {
    End(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override { service_->Forget(this); }

 private:
  void StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    has_sent_ = true;
    sent_ = latest_;
    response_.set_status(latest_);
  }

  HealthService* const service_;
  const std::string name_;
  absl::Mutex mu_;
  ServingStatus latest_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = -1;
  ServingStatus sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool has_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool end_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  // Written only by the one write in flight.
  HealthCheckResponse response_;
};

HealthService::HealthService(const std::vector<std::string>& services,
                             CallHold* hold)
    : hold_(hold), services_(services.begin(), services.end()) {
  services_.insert("");
}

HealthService::~HealthService() = default;

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& service) const {
  if (services_.count(service) == 0) return HealthCheckResponse::SERVICE_UNKNOWN;
  return serving_ ? HealthCheckResponse::SERVING
                  : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServing(bool serving) {
  std::vector<std::pair<std::shared_ptr<WatchReactor>, ServingStatus>> tell;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    serving_ = serving;
    generation = ++generation_;
    for (const std::shared_ptr<WatchReactor>& watch : watches_) {
      tell.emplace_back(watch, StatusLocked(watch->name()));
    }
  }
  for (auto& [watch, status] : tell) watch->Update(status, generation);
}

void HealthService::EndWatches() {
  std::vector<std::shared_ptr<WatchReactor>> end;
  {
    absl::MutexLock lock(&mu_);
    watches_ended_ = true;
    end.assign(watches_.begin(), watches_.end());
  }
  const grpc::Status status(grpc::StatusCode::UNAVAILABLE, kShuttingDown);
  for (const std::shared_ptr<WatchReactor>& watch : end) watch->End(status);
}

void HealthService::Forget(WatchReactor* watch) {
  std::shared_ptr<WatchReactor> last;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = watches_.begin(); it != watches_.end(); ++it) {
    if (it->get() == watch) {
      last = *it;
      watches_.erase(it);
      break;
    }
  }
}

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("unknown service \"", request->service(),
                     "\"; known: \"", absl::StrJoin(services_, "\", \""),
                     "\"")));
    return reactor;
  }
  response->set_status(status);
  if (hold_ != nullptr &&
      hold_->Hold(absl::FromChrono(context->deadline()),
                  [reactor] { reactor->Finish(grpc::Status::OK); })) {
    return reactor;
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* /*context*/,
    const grpc::health::v1::HealthCheckRequest* request) {
  auto watch = std::make_shared<WatchReactor>(this, request->service());
  ServingStatus status;
  int64_t generation;
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked(request->service());
    generation = generation_;
    ended = watches_ended_;
    // Registered even when ended: OnDone() (after the Finish below) looks
    // for it, and it keeps the reactor alive until then.
    watches_.insert(watch);
  }
  watch->Begin(status, generation, ended);
  return watch.get();
}

}  // namespace knnd
