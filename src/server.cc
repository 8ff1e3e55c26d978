#include "knnd/server.h"

#include <climits>
#include <random>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "knnd/search_request.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

constexpr char kServiceName[] = "knnd.v1.KnnService";

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// A config duration in ms where 0 means "never" as a gRPC channel argument,
// for which INT_MAX means "never". ValidateConfig() bounds it to INT_MAX.
int MillisOrInfinite(uint32_t ms) {
  return ms == 0 ? INT_MAX : static_cast<int>(ms);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(
    const knnd::v1::ServerConfig& config) {
  std::unique_ptr<Server> server(new Server(config));
  WorkerPool::Options pool_options;
  pool_options.num_threads = static_cast<int>(config.num_workers());
  pool_options.omp_threads_per_worker =
      static_cast<int>(config.omp_threads_per_worker());
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
      metrics_options, server->gate_.get(), server->pool_.get());
  if (!metrics.ok()) return metrics.status();
  server->metrics_ = std::move(*metrics);

  Batcher::Options batcher_options;
  batcher_options.max_batch_rows = static_cast<int>(config.max_batch_rows());
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
  service_options.slow_request = absl::Milliseconds(config.slow_request_ms());
  server->service_ = std::make_unique<KnnServiceImpl>(
      service_options, &server->holder_, server->gate_.get(),
      server->batcher_.get(), server->metrics_.get());
  return server;
}

Server::~Server() {
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    grpc_server_->Wait();
  }
}

absl::Status Server::Start() {
  if (absl::Status s = metrics_->StartExposer(); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  if (config_.enable_reflection()) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen_address(),
                           grpc::InsecureServerCredentials(), &port_);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(config_.max_receive_message_bytes()));
  // GOAWAY after max_connection_age_ms, so clients reconnect and re-resolve
  // and long-lived HTTP/2 connections spread over new replicas.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_MS,
      MillisOrInfinite(config_.max_connection_age_ms()));
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
      MillisOrInfinite(config_.max_connection_age_grace_ms()));
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", config_.listen_address(),
        " (address in use or invalid)"));
  }
  SetServing(false);
  spdlog::info("listening on {} (port {}), {} workers x {} OpenMP threads",
               config_.listen_address(), port_, pool_->num_threads(),
               config_.omp_threads_per_worker());
  spdlog::info("metrics on http://{}/metrics (port {})",
               config_.metrics_listen_address(), metrics_->port());
  return absl::OkStatus();
}

void Server::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health =
      grpc_server_->GetHealthCheckService();
  health->SetServingStatus(serving);
  health->SetServingStatus(kServiceName, serving);
}

absl::Status Server::LoadIndex() {
  LoadOptions options;
  options.use_precomputed_table = config_.use_precomputed_table();
  options.probe_in_subprocess = config_.probe_index_in_subprocess();
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(config_.index_path(), options);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<const IndexSnapshot> snapshot = std::move(*loaded);
  const IndexInfo& info = snapshot->info();
  spdlog::info(
      "index {}: {} | {} vectors x {} dims, {} | nlist {}, PQ M={} x {} bits "
      "({} B/vector) | file {:.1f} MiB mapped, heap {:.1f} MiB (precomputed "
      "table {:.1f} MiB) | loaded in {:.1f} ms",
      info.path, info.index_type, info.ntotal, info.dim,
      MetricName(info.metric), info.nlist, info.pq_m, info.pq_nbits,
      info.code_size_bytes, MiB(info.file_bytes), MiB(info.heap_bytes),
      MiB(info.precomputed_table_bytes),
      absl::ToDoubleMilliseconds(info.load_duration));
  if (absl::Status s = WarmUp(*snapshot); !s.ok()) return s;
  metrics_->SetIndexInfo(info);
  holder_.Publish(std::move(snapshot));
  SetServing(true);
  spdlog::info("SERVING");
  return absl::OkStatus();
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
  args.nprobe = ResolveLimits(1, 1, static_cast<int>(config_.default_nprobe()),
                              static_cast<int>(config_.max_nprobe()), 0, info)
                    .default_nprobe;
  args.distances = distances.data();
  args.ids = ids.data();
  const absl::Time start = absl::Now();
  absl::Status status;
  absl::Notification done;
  pool_->Submit([&] {
    status = snapshot.Search(args);
    done.Notify();
  });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("warm-up search failed: ", status.message()));
  }
  spdlog::info("warm-up: {} queries at nprobe {} in {:.1f} ms", n, args.nprobe,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

bool Server::Drain(absl::Duration grace) {
  if (grpc_server_ == nullptr) return true;
  SetServing(false);
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
  spdlog::info("drained");
  return idle;
}

}  // namespace knnd
