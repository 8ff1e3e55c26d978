#include "knnd/server.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/config/server_options.h"
#include "knnd/rpc/http_api.h"
#include "knnd/rpc/listener.h"
#include "knnd/rpc/transport_security.h"
#include "knnd/serving/malloc_settings.h"
#include "knnd/serving/serving_load.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

constexpr char kServiceName[] = "knnd.v1.KnnService";

// CloseListeners(): how long calls are held before Shutdown() (a client
// answered just before the hold sends its next call into it, not into the
// shut-down core), and how long after it before the held calls are
// answered (GOAWAY is on the wire well before: Shutdown() sends it at
// once). A held call waits at most their sum.
constexpr absl::Duration kHoldBeforeGoaway = absl::Milliseconds(100);
constexpr absl::Duration kGoawayToAnswer = absl::Milliseconds(100);
// Shutdown()'s deadline is never nearer than this, so that the held calls
// are answered before gRPC cancels what is left.
constexpr absl::Duration kMinCloseTime = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(
    const knnd::v1::ServerConfig& config) {
  ApplyMallocSettings(MallocSettingsFrom(config));
  std::unique_ptr<Server> server(new Server(config));
  Server* s = server.get();

  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Create(WorkerPoolOptionsFrom(config));
  if (!pool.ok()) return pool.status();
  s->pool_ = std::move(*pool);
  AdmissionGate::Options gate_options = GateOptionsFrom(config);
  gate_options.num_workers = s->pool_->num_threads();
  s->gate_ = std::make_unique<AdmissionGate>(gate_options);
  s->memory_budget_ = MemoryBudget::Create(MemoryBudgetOptionsFrom(config),
                                           s->gate_.get(), &s->holder_);
  s->heap_trimmer_ =
      std::make_unique<HeapTrimmer>(HeapTrimmerOptionsFrom(config));

  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(
      MetricsOptionsFrom(config), ServingLoad(s->gate_.get(), s->pool_.get()));
  if (!metrics.ok()) return metrics.status();
  s->metrics_ = std::move(*metrics);

  absl::StatusOr<std::unique_ptr<Batcher>> batcher =
      Batcher::Create(BatcherOptionsFrom(config), s->pool_.get(),
                      s->metrics_.get(), s->gate_.get());
  if (!batcher.ok()) return batcher.status();
  s->batcher_ = std::move(*batcher);

  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create(AuthOptionsFrom(config));
  if (!auth.ok()) return auth.status();
  s->auth_ = std::move(*auth);
  s->health_service_ = std::make_unique<HealthService>(
      std::vector<std::string>{kServiceName}, &s->hold_);
  if (!config.health_listen_address().empty()) {
    s->health_only_service_ = std::make_unique<HealthService>(
        std::vector<std::string>{kServiceName}, &s->hold_);
  }
  if (config.shard_targets_size() > 0) {
    // A front of shards: no index, no index manager, no admin API.
    ShardFront::Options front_options = ShardFrontOptionsFrom(config);
    if (!config.shard_token_file().empty()) {
      absl::StatusOr<std::string> token =
          ReadFirstToken(config.shard_token_file());
      if (!token.ok()) return token.status();
      front_options.shard_token = std::move(*token);
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeShardChannelCredentials(config);
    if (!credentials.ok()) return credentials.status();
    front_options.credentials = std::move(*credentials);
    absl::StatusOr<std::unique_ptr<ShardFront>> front = ShardFront::Create(
        front_options, s->gate_.get(), s->metrics_.get(), s->auth_.get(),
        &s->hold_, [s](bool serving) { s->OnServingChanged(serving); });
    if (!front.ok()) return front.status();
    s->front_ = std::move(*front);
    return server;
  }
  s->service_ = std::make_unique<KnnServiceImpl>(
      KnnServiceOptionsFrom(config), &s->holder_, s->gate_.get(),
      s->batcher_.get(), s->metrics_.get(), s->auth_.get(), &s->hold_);

  absl::StatusOr<std::unique_ptr<VersionPreparation>> preparation =
      VersionPreparation::Create(PreparationOptionsFrom(config),
                                 s->pool_.get(), &s->holder_);
  if (!preparation.ok()) return preparation.status();
  s->preparation_ = std::move(*preparation);

  IndexManager::Options manager_options = IndexManagerOptionsFrom(config);
  manager_options.serving_changed = [s](bool serving) {
    s->OnServingChanged(serving);
  };
  absl::StatusOr<std::unique_ptr<IndexManager>> manager = IndexManager::Create(
      manager_options, &s->holder_, s->metrics_.get(),
      {s->memory_budget_.get(), s->preparation_.get()});
  if (!manager.ok()) return manager.status();
  s->index_manager_ = std::move(*manager);
  if (!config.admin_listen_address().empty()) {
    s->admin_service_ = std::make_unique<AdminServiceImpl>(
        s->index_manager_.get(), s->auth_.get());
  }
  return server;
}

Server::~Server() {
  {
    absl::MutexLock lock(&serving_mu_);
    draining_ = true;  // the index manager's callbacks no longer reach gRPC
  }
  if (http_ != nullptr) http_->Close(absl::InfinitePast());
  admin_listener_.Close(absl::InfinitePast());
  search_listener_.Close(absl::InfinitePast());
  health_listener_.Close(absl::InfinitePast());
  if (front_ != nullptr) front_->Stop();
}

void Server::RequestReload() {
  if (index_manager_ != nullptr) index_manager_->RequestReload();
}

absl::Status Server::Start() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(config_);
  if (!credentials.ok()) return credentials.status();
  if (absl::Status s = metrics_->StartExposer(); !s.ok()) return s;
  heap_trimmer_->Start();
  const ConnectionLimits limits =
      ConnectionLimitsFrom(config_, gate_->max_inflight_bytes());
  spdlog::info(
      "gRPC holds at most {:.1f} MiB for requests being received and answers "
      "being sent (grpc_memory_quota_bytes); largest request message "
      "{:.1f} MiB (max_receive_message_bytes {:.1f} MiB, at most half the "
      "quota and the byte budget); Search messages read {} at a time",
      limits.memory_quota_bytes / 1048576.0,
      limits.max_receive_message_bytes / 1048576.0,
      config_.max_receive_message_bytes() / 1048576.0, RequestReads(limits));

  // One port for both when the addresses are the same, unless that is an
  // ephemeral port (":0"), which gives each listener its own.
  const bool shared_admin =
      admin_service_ != nullptr &&
      config_.admin_listen_address() == config_.listen_address() &&
      !absl::EndsWith(config_.listen_address(), ":0");
  ListenerSpec search;
  search.address = config_.listen_address();
  search.credentials = *credentials;
  search.limits = limits;
  search.reflection = config_.enable_reflection();
  // One queue drained by a thread per core: the thread that polled a
  // call in takes it from the queue itself (no hand-off), and a thread
  // busy with a small search inline (Batcher inline_max_rows) holds up no
  // call, which the other threads take (bench/RESULTS.md, "Every service
  // on the asynchronous API": one queue per thread had the same q/s and
  // a 20% higher p99 at 32 clients).
  search.queues = 1;
  search.threads_per_queue = AvailableCores();
  search.poll_us = static_cast<int>(config_.grpc_poll_us());
  // Only while every worker is idle: with searches queued or running on the
  // workers (large requests, overload), a polling thread would take their
  // cores (bench/RESULTS.md, "Polling only while the workers are idle").
  search.may_poll = [pool = pool_.get()] { return pool->all_idle(); };
  search.thread_name = "knnd-grpc";
  search.services.push_back(front_ != nullptr ? front_->service()
                                              : service_.get());
  search.services.push_back(health_service_.get());
  if (shared_admin) search.services.push_back(admin_service_.get());
  absl::StatusOr<Listener> listener = BuildListener(search);
  if (!listener.ok()) return listener.status();
  search_listener_ = std::move(*listener);
  port_ = search_listener_.port;

  if (!config_.health_listen_address().empty()) {
    ListenerSpec health;
    health.address = config_.health_listen_address();
    health.role = "health_listen_address";
    health.credentials = grpc::InsecureServerCredentials();
    health.limits = SmallPortLimits(limits);
    health.thread_name = "knnd-health";
    health.services.push_back(health_only_service_.get());
    absl::StatusOr<Listener> built = BuildListener(health);
    if (!built.ok()) return built.status();
    health_listener_ = std::move(*built);
    health_port_ = health_listener_.port;
    spdlog::info("plaintext grpc.health.v1 only on {} (port {})",
                 config_.health_listen_address(), health_port_);
  }
  if (absl::Status s = StartHttp(limits); !s.ok()) return s;
  spdlog::info("listening on {} (port {}, {}), {} workers x {} OpenMP "
               "threads at nice +{}",
               config_.listen_address(), port_,
               !UsesTls(config_)                      ? "plaintext"
               : config_.tls_client_ca_file().empty() ? "TLS"
                                                      : "mutual TLS",
               pool_->num_threads(), config_.omp_threads_per_worker(),
               config_.worker_nice());
  if (shared_admin) {
    admin_port_ = port_;
    spdlog::info("admin API on the search port");
  } else if (admin_service_ != nullptr) {
    ListenerSpec admin;
    admin.address = config_.admin_listen_address();
    admin.role = "admin_listen_address";
    admin.credentials = grpc::InsecureServerCredentials();
    admin.limits = SmallPortLimits(limits);
    admin.reflection = config_.enable_reflection();
    admin.thread_name = "knnd-admin";
    admin.services.push_back(admin_service_.get());
    absl::StatusOr<Listener> built = BuildListener(admin);
    if (!built.ok()) return built.status();
    admin_listener_ = std::move(*built);
    admin_port_ = admin_listener_.port;
    spdlog::info("admin API on {} (port {})", config_.admin_listen_address(),
                 admin_port_);
  } else if (front_ != nullptr) {
    spdlog::info("admin API off: a front of shards has no versions of its "
                 "own (each shard's admin API controls its versions)");
  } else {
    spdlog::info("admin API off (admin_listen_address is empty)");
  }
  spdlog::info("metrics on http://{}/metrics (port {})",
               config_.metrics_listen_address(), metrics_->port());
  return absl::OkStatus();
}

absl::Status Server::StartHttp(const ConnectionLimits& limits) {
  if (config_.http_listen_address().empty()) return absl::OkStatus();
  std::vector<HttpRoute> routes =
      front_ != nullptr ? KnnRoutes(front_.get()) : KnnRoutes(service_.get());
  for (HttpRoute& route : HealthRoutes(health_service_.get(), kServiceName)) {
    routes.push_back(std::move(route));
  }
  HttpServer::Options options = HttpServerOptionsFrom(config_, limits);
  options.refusal = HttpRefusal;
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(options, RouteRequests(std::move(routes)));
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  spdlog::info(
      "HTTP/JSON API on {} (port {}, {}): bodies up to {:.1f} MiB, {:.1f} MiB "
      "of them at once (http_memory_quota_bytes), {} connections at most",
      config_.http_listen_address(), http_->port(),
      UsesTls(config_) ? "TLS" : "plaintext",
      options.max_body_bytes / 1048576.0,
      options.memory_quota_bytes / 1048576.0, options.max_connections);
  return absl::OkStatus();
}

void Server::OnServingChanged(bool serving) {
  absl::MutexLock lock(&serving_mu_);
  // Once draining (or destroying), health stays as Drain() set it.
  if (draining_) return;
  SetServing(serving);
}

void Server::SetServing(bool serving) {
  // A front of shards is alive ("" SERVING) until it drains, whether or not
  // its shards are up: restarting it would not bring them back.
  const bool overall = front_ != nullptr ? !draining_ : serving;
  for (HealthService* health :
       {health_service_.get(), health_only_service_.get()}) {
    if (health != nullptr) health->SetStatuses(serving, overall);
  }
}

absl::Status Server::LoadIndex() {
  if (front_ != nullptr) {
    // Health turns SERVING once every shard answers as one set.
    spdlog::info("front of {} shards: {}", config_.shard_targets_size(),
                 absl::StrJoin(config_.shard_targets(), ", "));
    memory_budget_->SetByteBudgetFor(IndexInfo{});
    {
      absl::MutexLock lock(&serving_mu_);
      if (!draining_) SetServing(false);  // alive, not ready yet
    }
    front_->Start();
    return absl::OkStatus();
  }
  absl::StatusOr<IndexManager::Outcome> served = index_manager_->Reload();
  if (!served.ok()) return served.status();
  // Health turned SERVING when the version was published (serving_changed).
  spdlog::info("SERVING");
  return absl::OkStatus();
}

bool Server::Drain(const DrainPlan& plan) {
  if (!search_listener_.open()) return true;
  {
    absl::MutexLock lock(&serving_mu_);
    draining_ = true;
    SetServing(false);
  }
  // HTTP/1.1 clients keep a connection for ever: each answer from now on
  // closes it, so that the client's next request connects afresh (to
  // another replica once the endpoints are updated).
  if (http_ != nullptr) http_->SetClosing();
  if (plan.delay > absl::ZeroDuration()) {
    if (plan.refuse_during_delay) gate_->StartDraining();
    spdlog::info("shutting down: health NOT_SERVING, {} searches for the "
                 "shutdown delay ({}) before draining",
                 plan.refuse_during_delay ? "refusing" : "still serving",
                 absl::FormatDuration(plan.delay));
    if (end_delay_.WaitForNotificationWithTimeout(plan.delay)) {
      spdlog::info("shutdown delay cut short by a second signal");
    }
  }
  gate_->StartDraining();
  const absl::Time deadline = absl::Now() + plan.grace;
  spdlog::info("draining: {} queries in flight, grace period {}",
               gate_->queries_in_flight(), absl::FormatDuration(plan.grace));
  const bool idle = gate_->WaitUntilIdle(deadline);
  if (!idle) {
    spdlog::warn("grace period over with {} queries still in flight",
                 gate_->queries_in_flight());
  }
  CloseListeners(std::max(deadline, absl::Now() + kMinCloseTime));
  spdlog::info("drained");
  return idle;
}

void Server::CloseListeners(absl::Time deadline) {
  hold_.Start();
  absl::SleepFor(kHoldBeforeGoaway);
  // Shutdown() stops listening and sends GOAWAY at once, then waits for the
  // calls still open (the held ones among them; those still running past
  // `deadline` are cancelled by gRPC): one thread per listener, so that
  // every listener's GOAWAY is out before the held calls are answered.
  std::vector<std::thread> closing;
  for (Listener* listener : {&search_listener_, &health_listener_}) {
    if (!listener->open()) continue;
    closing.emplace_back([listener, deadline] { listener->Close(deadline); });
  }
  if (http_ != nullptr) {
    closing.emplace_back(
        [http = http_.get(), deadline] { http->Close(deadline); });
  }
  absl::SleepFor(kGoawayToAnswer);
  hold_.Release();
  for (HealthService* health :
       {health_service_.get(), health_only_service_.get()}) {
    if (health != nullptr) health->EndWatches();
  }
  for (std::thread& t : closing) t.join();
  admin_listener_.Close(absl::InfinitePast());
}

}  // namespace knnd
