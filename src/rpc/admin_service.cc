#include "knnd/rpc/admin_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/rpc/status_util.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

// The token check of an admin call: OK, or the refusal to send (logged
// with the peer, never with the token).
absl::Status Authorize(const TokenAuthenticator& auth,
                       const grpc::ServerContext& context,
                       absl::string_view method) {
  absl::Status allowed =
      auth.CheckCall(context, absl::StrCat("/knnd.v1.AdminService/", method));
  if (!allowed.ok()) {
    spdlog::warn("admin {} from {} refused: {}", std::string(method),
                 context.peer(), allowed.ToString());
  }
  return allowed;
}

}  // namespace

AdminServiceImpl::AdminServiceImpl(IndexManager* manager,
                                   const TokenAuthenticator* auth)
    : manager_(manager),
      auth_(auth),
      reload_(&service_, &Async::RequestReloadIndex,
              [this](ReloadCall* call) {
                Run(call, "ReloadIndex", [this, call] {
                  return ReloadIndex(call->context(), &call->request(),
                                     call->response());
                });
              }),
      list_(&service_, &Async::RequestListVersions, [this](ListCall* call) {
        Run(call, "ListVersions", [this, call] {
          return ListVersions(call->context(), &call->request(),
                              call->response());
        });
      }) {
  WorkerPool::Options options;
  options.num_threads = 2;
  // They wait on the index manager; not searches to yield to gRPC's threads.
  options.nice_increment = 0;
  options.thread_name = "knnd-admin-call";
  absl::StatusOr<std::unique_ptr<WorkerPool>> threads =
      WorkerPool::Create(options);
  // Create() fails only on options out of range.
  threads_ = std::move(threads).value();
}

// The pool runs what is queued before it joins: every call has been
// answered by then (its listener closed before).
AdminServiceImpl::~AdminServiceImpl() { threads_.reset(); }

void AdminServiceImpl::Listen(const ServingQueue& queue) {
  reload_.Listen(queue);
  list_.Listen(queue);
}

template <class Call, class Handler>
void AdminServiceImpl::Run(Call* call, const char* method, Handler handler) {
  int busy = 0;
  {
    absl::MutexLock lock(&mu_);
    busy = calls_;
    if (calls_ < kMaxAdminCalls) ++calls_;
  }
  if (busy >= kMaxAdminCalls) {
    spdlog::warn("admin {} from {} refused: {} admin calls in progress",
                 method, call->context()->peer(), busy);
    call->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(busy, " admin calls are waiting or running (at most ",
                     kMaxAdminCalls, "); retry when they end")));
    return;
  }
  threads_->Submit([this, call, handler] {
    const grpc::Status status = handler();
    {
      absl::MutexLock lock(&mu_);
      --calls_;
    }
    call->Finish(status);
  });
}

grpc::Status AdminServiceImpl::ReloadIndex(
    grpc::ServerContext* context, const knnd::v1::ReloadIndexRequest* request,
    knnd::v1::ReloadIndexResponse* response) {
  if (absl::Status s = Authorize(*auth_, *context, "ReloadIndex"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const absl::Time start = absl::Now();
  spdlog::info("admin ReloadIndex from {}: {}", context->peer(),
               request->has_version()
                   ? (request->version() == 0
                          ? std::string("unpin, serve the latest version")
                          : "version " + std::to_string(request->version()))
                   : std::string("the latest (or pinned) version"));
  absl::StatusOr<IndexManager::Outcome> outcome =
      request->has_version() ? manager_->ReloadVersion(request->version())
                             : manager_->Reload();
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  response->set_version(outcome->version);
  response->set_path(outcome->path);
  response->set_previous_version(outcome->previous_version);
  response->set_loaded(outcome->loaded);
  response->set_pinned_version(outcome->pinned_version);
  response->set_duration_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::ListVersions(
    grpc::ServerContext* context,
    const knnd::v1::ListVersionsRequest* /*request*/,
    knnd::v1::ListVersionsResponse* response) {
  if (absl::Status s = Authorize(*auth_, *context, "ListVersions"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<IndexManager::VersionState>> versions =
      manager_->ListVersions();
  if (!versions.ok()) return ToGrpcStatus(versions.status());
  for (const IndexManager::VersionState& v : *versions) {
    knnd::v1::IndexVersionInfo* info = response->add_versions();
    info->set_version(v.version);
    info->set_path(v.path);
    info->set_serving(v.serving);
    info->set_retained(v.retained);
    info->set_refused(v.refused);
    info->set_refused_reason(v.refused_reason);
    if (v.serving) response->set_serving_version(v.version);
  }
  response->set_pinned_version(manager_->pinned_version());
  return grpc::Status::OK;
}

}  // namespace knnd
