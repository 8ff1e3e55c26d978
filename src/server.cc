#include "knnd/server.h"

#include <algorithm>
#include <climits>
#include <random>
#include <vector>

#include <malloc.h>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "knnd/base/units.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/monitoring/cgroup_memory.h"
#include "knnd/rpc/transport_security.h"
#include "knnd/serving/search_request.h"
#include "knnd/serving/serving_load.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

constexpr char kServiceName[] = "knnd.v1.KnnService";

// A config duration in ms where 0 means "never" as a gRPC channel argument,
// for which INT_MAX means "never". ValidateConfig() bounds it to INT_MAX.
int MillisOrInfinite(uint32_t ms) {
  return ms == 0 ? INT_MAX : static_cast<int>(ms);
}

// Gives this server reflection or takes it away. Linking gRPC's reflection
// library registers its plugin for every server at static initialisation,
// so turning reflection off means removing the plugin, and turning it on
// must not add it twice.
class ReflectionOption : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(
      std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    auto reflection = std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>();
    const std::string name = reflection->name();
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [&](const auto& p) { return p->name() == name; }),
                   plugins->end());
    if (enabled_) plugins->push_back(std::move(reflection));
  }

 private:
  const bool enabled_;
};

// The connection limits of the config's "Network" and "Security" blocks,
// for every listener that faces clients.
void AddConnectionLimits(const knnd::v1::ServerConfig& config,
                         grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(
      static_cast<int>(config.max_receive_message_bytes()));
  // GOAWAY after max_connection_age_ms, so clients reconnect and re-resolve
  // and long-lived HTTP/2 connections spread over new replicas.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                              MillisOrInfinite(config.max_connection_age_ms()));
  builder->AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
      MillisOrInfinite(config.max_connection_age_grace_ms()));
  builder->AddChannelArgument(
      GRPC_ARG_MAX_CONCURRENT_STREAMS,
      static_cast<int>(config.max_concurrent_streams()));
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(config.keepalive_min_ping_interval_ms()));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                              config.keepalive_permit_without_calls() ? 1 : 0);
  builder->AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                              static_cast<int>(config.max_metadata_bytes()));
}

// Stops `server` (if any) at once, cancelling the calls still open.
void ShutDownNow(grpc::Server* server) {
  if (server == nullptr) return;
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
}

// glibc malloc settings that keep freed request memory from staying
// resident (config "Memory" block). Process-wide; best before threads start.
void ApplyMallocOptions(const knnd::v1::ServerConfig& config) {
  if (config.malloc_arena_max() > 0 &&
      mallopt(M_ARENA_MAX, static_cast<int>(config.malloc_arena_max())) != 1) {
    spdlog::warn("mallopt(M_ARENA_MAX, {}) failed", config.malloc_arena_max());
  }
  const int64_t mmap_threshold = config.malloc_mmap_threshold_bytes();
  if (mmap_threshold > 0) {
    if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) {
      spdlog::warn("mallopt(M_MMAP_THRESHOLD, {}) failed", mmap_threshold);
    }
    // A fixed mmap threshold also freezes the trim threshold at 128 KiB: the
    // top of the heap was given back and faulted in again on nearly every
    // 256-row request (~95 page faults each). At the mmap threshold, an
    // arena keeps at most that much free at its top (twice it, glibc's own
    // ratio, left anonymous memory 1.5 MiB higher after a burst;
    // bench/RESULTS.md "Page faults").
    if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) {
      spdlog::warn("mallopt(M_TRIM_THRESHOLD, {}) failed", mmap_threshold);
    }
  }
  // The coarse search's distance block then stays on the heap instead of
  // being mapped and faulted in on every call (0 leaves FAISS's default).
  SetCoarseBlockRowsUnder(mmap_threshold);
}

// The configured memory limit, else the cgroup's; 0 when there is none.
MemoryLimits ResolveMemoryLimits(const knnd::v1::ServerConfig& config) {
  MemoryLimits limits;
  limits.headroom_bytes = static_cast<int64_t>(config.memory_headroom_bytes());
  if (config.memory_limit_bytes() > 0) {
    limits.limit_bytes = static_cast<int64_t>(config.memory_limit_bytes());
    spdlog::info("memory limit {:.1f} MiB (memory_limit_bytes), headroom "
                 "{:.1f} MiB",
                 MiB(limits.limit_bytes), MiB(limits.headroom_bytes));
    return limits;
  }
  absl::optional<CgroupMemory> cg = ReadCgroupMemory("/proc", "/sys/fs/cgroup");
  if (cg.has_value() && cg->limit_bytes.has_value()) {
    limits.limit_bytes = *cg->limit_bytes;
    spdlog::info("memory limit {:.1f} MiB (cgroup v{} {}), headroom {:.1f} MiB",
                 MiB(limits.limit_bytes), cg->version, cg->dir,
                 MiB(limits.headroom_bytes));
  } else {
    spdlog::info("no memory limit found (no cgroup limit, memory_limit_bytes "
                 "unset): max_inflight_bytes={} applies",
                 config.max_inflight_bytes());
  }
  return limits;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(
    const knnd::v1::ServerConfig& config) {
  ApplyMallocOptions(config);
  std::unique_ptr<Server> server(new Server(config));
  server->memory_limits_ = ResolveMemoryLimits(config);
  WorkerPool::Options pool_options;
  pool_options.num_threads = static_cast<int>(config.num_workers());
  pool_options.omp_threads_per_worker =
      static_cast<int>(config.omp_threads_per_worker());
  pool_options.nice_increment = static_cast<int>(config.worker_nice());
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Create(pool_options);
  if (!pool.ok()) return pool.status();
  server->pool_ = std::move(*pool);

  AdmissionGate::Options gate_options;
  gate_options.max_inflight_queries =
      static_cast<int64_t>(config.max_inflight_queries());
  gate_options.max_inflight_bytes =
      static_cast<int64_t>(config.max_inflight_bytes());
  server->gate_ = std::make_unique<AdmissionGate>(gate_options);

  Metrics::Options metrics_options;
  metrics_options.listen_address = config.metrics_listen_address();
  metrics_options.process.max_residency_scan_bytes_per_scrape =
      static_cast<int64_t>(config.metrics_residency_scan_bytes());
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(
      metrics_options, ServingLoad(server->gate_.get(), server->pool_.get()));
  if (!metrics.ok()) return metrics.status();
  server->metrics_ = std::move(*metrics);

  Batcher::Options batcher_options;
  batcher_options.max_batch_rows = static_cast<int>(config.max_batch_rows());
  batcher_options.coalesce = config.coalesce_requests();
  batcher_options.max_queue_delay_us = config.max_queue_delay_us();
  batcher_options.inline_max_rows = static_cast<int>(config.inline_max_rows());
  absl::StatusOr<std::unique_ptr<Batcher>> batcher = Batcher::Create(
      batcher_options, server->pool_.get(), server->metrics_.get());
  if (!batcher.ok()) return batcher.status();
  server->batcher_ = std::move(*batcher);

  KnnServiceImpl::Options service_options;
  service_options.max_k = static_cast<int>(config.max_k());
  service_options.max_queries_per_request =
      static_cast<int64_t>(config.max_queries_per_request());
  service_options.default_nprobe = static_cast<int>(config.default_nprobe());
  service_options.max_nprobe = static_cast<int>(config.max_nprobe());
  service_options.max_filter_ids =
      static_cast<int64_t>(config.max_filter_ids());
  service_options.max_receive_message_bytes =
      static_cast<int64_t>(config.max_receive_message_bytes());
  service_options.retry_pushback_ms =
      static_cast<int>(config.retry_pushback_ms());
  service_options.max_batch_rows = static_cast<int64_t>(config.max_batch_rows());
  service_options.slow_request = absl::Milliseconds(config.slow_request_ms());
  service_options.default_refine_factor =
      static_cast<int>(config.default_refine_factor());
  service_options.max_refine_factor =
      static_cast<int>(config.max_refine_factor());
  TokenAuthenticator::Options auth_options;
  auth_options.search_token_file = config.search_token_file();
  auth_options.admin_token_file = config.admin_token_file();
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create(auth_options);
  if (!auth.ok()) return auth.status();
  server->auth_ = std::move(*auth);
  server->service_ = std::make_unique<KnnServiceImpl>(
      service_options, &server->holder_, server->gate_.get(),
      server->batcher_.get(), server->metrics_.get(), server->auth_.get());

  IndexManager::Options manager_options;
  manager_options.index_path = config.index_path();
  manager_options.load.use_precomputed_table = config.use_precomputed_table();
  manager_options.load.probe_in_subprocess =
      config.probe_index_in_subprocess();
  manager_options.load.probe_timeout =
      absl::Seconds(config.index_probe_timeout_s());
  manager_options.load.vectors =
      !config.load_vectors()      ? VectorsPolicy::kIgnore
      : config.require_vectors()  ? VectorsPolicy::kRequired
                                  : VectorsPolicy::kOptional;
  manager_options.poll_interval =
      absl::Milliseconds(config.index_poll_interval_ms());
  manager_options.keep_previous_versions =
      static_cast<int>(config.keep_previous_versions());
  using ChecksumCheck = IndexManager::Options::ChecksumCheck;
  manager_options.checksum_check =
      config.checksum_check() == "before_serving" ? ChecksumCheck::kBeforeServing
      : config.checksum_check() == "off"          ? ChecksumCheck::kOff
                                                  : ChecksumCheck::kBackground;
  manager_options.serving_changed = [s = server.get()](bool serving) {
    s->OnServingChanged(serving);
  };
  manager_options.load.check_heap = [s = server.get()](const IndexInfo& info) {
    return s->CheckHeap(info);
  };
  manager_options.prepare = [s = server.get()](const IndexSnapshot& snapshot) {
    absl::Status status = s->Prepare(snapshot);
    if (status.ok()) s->SetByteBudget(snapshot.info());
    return status;
  };
  if (!config.canary_queries_path().empty()) {
    absl::StatusOr<CanarySet> canary = LoadCanarySet(
        config.canary_queries_path(), config.canary_ground_truth_path());
    if (!canary.ok()) return canary.status();
    spdlog::info("canary check: {} queries from {}, recall@{} >= {} against {}",
                 canary->queries.rows, config.canary_queries_path(),
                 config.canary_k(), config.canary_min_recall(),
                 config.canary_ground_truth_path().empty()
                     ? std::string("the serving version searched exhaustively")
                     : config.canary_ground_truth_path());
    server->canary_ = std::make_unique<const CanarySet>(*std::move(canary));
  }
  absl::StatusOr<std::unique_ptr<IndexManager>> manager = IndexManager::Create(
      manager_options, &server->holder_, server->metrics_.get());
  if (!manager.ok()) return manager.status();
  server->index_manager_ = std::move(*manager);
  if (!config.admin_listen_address().empty()) {
    server->admin_service_ =
        std::make_unique<AdminServiceImpl>(server->index_manager_.get(),
                                           server->auth_.get());
  }
  return server;
}

Server::~Server() {
  {
    absl::MutexLock lock(&serving_mu_);
    draining_ = true;  // the index manager's callbacks no longer reach gRPC
  }
  ShutDownNow(admin_server_.get());
  ShutDownNow(grpc_server_.get());
  ShutDownNow(health_server_.get());
}

absl::Status Server::Start() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(config_);
  if (!credentials.ok()) return credentials.status();
  if (absl::Status s = metrics_->StartExposer(); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen_address(), *credentials, &port_);
  AddConnectionLimits(config_, &builder);
  builder.SetOption(
      std::make_unique<ReflectionOption>(config_.enable_reflection()));
  builder.RegisterService(service_.get());
  // One port for both when the addresses are the same, unless that is an
  // ephemeral port (":0"), which gives each listener its own.
  const bool shared_admin =
      admin_service_ != nullptr &&
      config_.admin_listen_address() == config_.listen_address() &&
      !absl::EndsWith(config_.listen_address(), ":0");
  if (shared_admin) builder.RegisterService(admin_service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", config_.listen_address(),
        " (address in use or invalid)"));
  }
  if (!config_.health_listen_address().empty()) {
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(config_.health_listen_address(),
                                    grpc::InsecureServerCredentials(),
                                    &health_port_);
    AddConnectionLimits(config_, &health_builder);
    health_builder.SetOption(std::make_unique<ReflectionOption>(false));
    // gRPC starts no server without a service of its own; this one answers
    // every method but health's with UNIMPLEMENTED.
    health_builder.RegisterCallbackGenericService(&unimplemented_);
    health_server_ = health_builder.BuildAndStart();
    if (health_server_ == nullptr || health_port_ == 0) {
      health_server_.reset();
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on health_listen_address ",
          config_.health_listen_address(), " (address in use or invalid)"));
    }
    spdlog::info("plaintext grpc.health.v1 only on {} (port {})",
                 config_.health_listen_address(), health_port_);
  }
  SetServing(false);
  spdlog::info("listening on {} (port {}, {}), {} workers x {} OpenMP "
               "threads at nice +{}",
               config_.listen_address(), port_,
               !UsesTls(config_)                    ? "plaintext"
               : config_.tls_client_ca_file().empty() ? "TLS"
                                                      : "mutual TLS",
               pool_->num_threads(), config_.omp_threads_per_worker(),
               config_.worker_nice());
  if (shared_admin) {
    admin_port_ = port_;
    spdlog::info("admin API on the search port");
  } else if (admin_service_ != nullptr) {
    grpc::ServerBuilder admin;
    admin.AddListeningPort(config_.admin_listen_address(),
                           grpc::InsecureServerCredentials(), &admin_port_);
    AddConnectionLimits(config_, &admin);
    admin.SetOption(
        std::make_unique<ReflectionOption>(config_.enable_reflection()));
    admin.RegisterService(admin_service_.get());
    admin_server_ = admin.BuildAndStart();
    if (admin_server_ == nullptr || admin_port_ == 0) {
      admin_server_.reset();
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on admin_listen_address ",
          config_.admin_listen_address(), " (address in use or invalid)"));
    }
    spdlog::info("admin API on {} (port {})", config_.admin_listen_address(),
                 admin_port_);
  } else {
    spdlog::info("admin API off (admin_listen_address is empty)");
  }
  spdlog::info("metrics on http://{}/metrics (port {})",
               config_.metrics_listen_address(), metrics_->port());
  return absl::OkStatus();
}

void Server::OnServingChanged(bool serving) {
  absl::MutexLock lock(&serving_mu_);
  // Once draining (or destroying), health stays as Drain() set it.
  if (draining_) return;
  SetServing(serving);
}

void Server::SetServing(bool serving) {
  for (grpc::Server* server : {grpc_server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    health->SetServingStatus(serving);
    health->SetServingStatus(kServiceName, serving);
  }
}

absl::Status Server::LoadIndex() {
  absl::StatusOr<IndexManager::Outcome> served = index_manager_->Reload();
  if (!served.ok()) return served.status();
  // Health turned SERVING when the version was published (serving_changed).
  spdlog::info("SERVING");
  return absl::OkStatus();
}

absl::Status Server::Prepare(const IndexSnapshot& snapshot) {
  if (absl::Status s = WarmUp(snapshot); !s.ok()) return s;
  return CheckCanaryOf(snapshot);
}

absl::Status Server::RunOnWorker(const std::function<absl::Status()>& work) {
  absl::Status status;
  absl::Notification done;
  pool_->Submit([&] {
    status = work();
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

int Server::DefaultNprobe(const IndexInfo& info) const {
  return ResolveLimits(1, 1, static_cast<int>(config_.default_nprobe()),
                       static_cast<int>(config_.max_nprobe()), 0, info)
      .default_nprobe;
}

absl::Status Server::CheckHeap(const IndexInfo& planned) {
  std::shared_ptr<const IndexSnapshot> serving = holder_.Pin();
  const int64_t other = serving == nullptr ? 0 : serving->info().heap_bytes;
  spdlog::info("index {}: heap need {:.1f} MiB (precomputed table {:.1f} MiB"
               "{}), mapped lists {:.1f} MiB",
               planned.path, MiB(planned.heap_bytes),
               MiB(planned.precomputed_table_bytes),
               config_.use_precomputed_table() ? "" : ", turned off",
               MiB(planned.mapped_list_bytes));
  return CheckIndexFits(planned, other, memory_limits_);
}

void Server::SetByteBudget(const IndexInfo& info) {
  if (memory_limits_.limit_bytes <= 0 || config_.has_max_inflight_bytes()) {
    return;
  }
  const int64_t budget = InflightBytesBudget(
      memory_limits_, info.heap_bytes,
      static_cast<int>(config_.inflight_bytes_limit_percent()),
      static_cast<int64_t>(config_.max_inflight_bytes()));
  gate_->SetMaxInflightBytes(budget);
  SearchShape largest{static_cast<int64_t>(config_.max_queries_per_request()),
                      static_cast<int>(config_.max_k()),
                      static_cast<int>(info.nlist), 0,
                      info.has_vectors
                          ? static_cast<int>(config_.max_refine_factor())
                          : 0,
                      static_cast<int64_t>(config_.max_batch_rows())};
  const int64_t largest_bytes = EstimateSearchBytes(info, largest);
  spdlog::info("max_inflight_bytes {:.1f} MiB: {}% of (limit {:.1f} MiB - "
               "index heap {:.1f} MiB - headroom {:.1f} MiB); the largest "
               "request allowed (max_queries_per_request x max_k, nprobe "
               "nlist) is estimated at {:.1f} MiB",
               MiB(budget), config_.inflight_bytes_limit_percent(),
               MiB(memory_limits_.limit_bytes), MiB(info.heap_bytes),
               MiB(memory_limits_.headroom_bytes), MiB(largest_bytes));
  if (largest_bytes > budget) {
    spdlog::warn("requests estimated above max_inflight_bytes ({:.1f} MiB) "
                 "are refused with INVALID_ARGUMENT; lower "
                 "max_queries_per_request or max_k, or raise the limit",
                 MiB(budget));
  }
}

// Runs seeded random queries through the same path as requests (a worker,
// the default nprobe) so that the first requests meet warm code and caches.
absl::Status Server::WarmUp(const IndexSnapshot& snapshot) {
  const int n = static_cast<int>(config_.warmup_queries());
  if (n == 0) return absl::OkStatus();
  const IndexInfo& info = snapshot.info();
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> queries(static_cast<size_t>(n) * info.dim);
  for (float& v : queries) v = normal(rng);
  const int k = 10;
  std::vector<float> distances(static_cast<size_t>(n) * k);
  std::vector<int64_t> ids(static_cast<size_t>(n) * k);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = k;
  args.nprobe = config_.warmup_nprobe() > 0
                    ? std::min(static_cast<int>(config_.warmup_nprobe()),
                               static_cast<int>(info.nlist))
                    : DefaultNprobe(info);
  if (info.has_vectors) {
    args.refine_factor = static_cast<int>(std::min(
        config_.default_refine_factor(), config_.max_refine_factor()));
  }
  args.distances = distances.data();
  args.ids = ids.data();
  const absl::Time start = absl::Now();
  absl::Status status = RunOnWorker([&] { return snapshot.Search(args); });
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("warm-up search failed: ", status.message()));
  }
  spdlog::info("warm-up: {} queries at nprobe {} in {:.1f} ms", n, args.nprobe,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status Server::CheckCanaryOf(const IndexSnapshot& snapshot) {
  if (canary_ == nullptr) return absl::OkStatus();
  // The version serving now (the reference without a ground truth): the
  // candidate is published only after this check.
  std::shared_ptr<const IndexSnapshot> serving = holder_.Pin();
  if (canary_->ground_truth.rows == 0 && serving == nullptr) {
    if (canary_->queries.dim != snapshot.info().dim) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "canary queries %s have dim=%d, the index dim=%d",
          config_.canary_queries_path(), canary_->queries.dim,
          snapshot.info().dim));
    }
    spdlog::info("canary check skipped for version {}: no version serving "
                 "to compare with and no ground truth",
                 snapshot.info().version);
    return absl::OkStatus();
  }
  CanaryOptions options;
  options.k = static_cast<int>(config_.canary_k());
  options.min_recall = config_.canary_min_recall();
  options.nprobe = DefaultNprobe(snapshot.info());
  const absl::Time start = absl::Now();
  absl::StatusOr<double> recall = CheckCanary(
      *canary_, snapshot, serving.get(), options,
      [this](std::function<absl::Status()> work) { return RunOnWorker(work); });
  if (!recall.ok()) return recall.status();
  spdlog::info("canary check of version {}: recall@{} = {:.4f} >= {} in {:.1f} ms",
               snapshot.info().version, options.k, *recall, options.min_recall,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

bool Server::Drain(absl::Duration grace) {
  if (grpc_server_ == nullptr) return true;
  {
    absl::MutexLock lock(&serving_mu_);
    draining_ = true;
    SetServing(false);
  }
  gate_->StartDraining();
  const absl::Time deadline = absl::Now() + grace;
  const int64_t in_flight = gate_->queries_in_flight();
  spdlog::info("draining: {} queries in flight, grace period {}", in_flight,
               absl::FormatDuration(grace));
  const bool idle = gate_->WaitUntilIdle(deadline);
  if (!idle) {
    spdlog::warn("grace period over with {} queries still in flight",
                 gate_->queries_in_flight());
  }
  // Calls still open after the deadline are cancelled by gRPC.
  grpc_server_->Shutdown(absl::ToChronoTime(std::max(deadline, absl::Now())));
  grpc_server_->Wait();
  grpc_server_.reset();
  ShutDownNow(health_server_.get());
  health_server_.reset();
  ShutDownNow(admin_server_.get());
  admin_server_.reset();
  spdlog::info("drained");
  return idle;
}

}  // namespace knnd
