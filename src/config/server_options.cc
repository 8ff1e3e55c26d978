#include "knnd/config/server_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace knnd {

using knnd::v1::ServerConfig;

absl::StatusOr<IndexManager::Options::ChecksumCheck> ParseChecksumCheck(
    absl::string_view value) {
  using ChecksumCheck = IndexManager::Options::ChecksumCheck;
  if (value == "background") return ChecksumCheck::kBackground;
  if (value == "before_serving") return ChecksumCheck::kBeforeServing;
  if (value == "off") return ChecksumCheck::kOff;
  return absl::InvalidArgumentError(absl::StrCat(
      "checksum_check=\"", value,
      "\" is none of \"background\", \"before_serving\", \"off\""));
}

MallocSettings MallocSettingsFrom(const ServerConfig& config) {
  MallocSettings settings;
  settings.arena_max = static_cast<int>(config.malloc_arena_max());
  settings.mmap_threshold_bytes =
      static_cast<int64_t>(config.malloc_mmap_threshold_bytes());
  settings.top_pad_bytes = static_cast<int64_t>(config.malloc_top_pad_bytes());
  return settings;
}

HeapTrimmer::Options HeapTrimmerOptionsFrom(const ServerConfig& config) {
  HeapTrimmer::Options options;
  options.interval = absl::Milliseconds(config.heap_trim_interval_ms());
  options.min_free_bytes =
      static_cast<int64_t>(std::min<uint64_t>(config.heap_trim_min_free_bytes(),
                                              uint64_t{1} << 62));
  return options;
}

WorkerPool::Options WorkerPoolOptionsFrom(const ServerConfig& config) {
  WorkerPool::Options options;
  options.num_threads = static_cast<int>(config.num_workers());
  options.omp_threads_per_worker =
      static_cast<int>(config.omp_threads_per_worker());
  options.nice_increment = static_cast<int>(config.worker_nice());
  return options;
}

AdmissionGate::Options GateOptionsFrom(const ServerConfig& config) {
  AdmissionGate::Options options;
  options.max_inflight_queries =
      static_cast<int64_t>(config.max_inflight_queries());
  options.max_inflight_bytes = static_cast<int64_t>(config.max_inflight_bytes());
  options.max_queue_time = absl::Milliseconds(config.max_queue_time_ms());
  return options;
}

Metrics::Options MetricsOptionsFrom(const ServerConfig& config) {
  Metrics::Options options;
  options.listen_address = config.metrics_listen_address();
  options.process.max_residency_scan_bytes_per_scrape =
      static_cast<int64_t>(config.metrics_residency_scan_bytes());
  return options;
}

Batcher::Options BatcherOptionsFrom(const ServerConfig& config) {
  Batcher::Options options;
  options.max_batch_rows = static_cast<int>(config.max_batch_rows());
  options.coalesce = config.coalesce_requests();
  options.max_queue_delay_us = config.max_queue_delay_us();
  options.inline_max_rows = static_cast<int>(config.inline_max_rows());
  return options;
}

LimitsConfig LimitsConfigFrom(const ServerConfig& config) {
  LimitsConfig limits;
  limits.max_k = static_cast<int>(config.max_k());
  limits.max_queries_per_request =
      static_cast<int64_t>(config.max_queries_per_request());
  limits.default_nprobe = static_cast<int>(config.default_nprobe());
  limits.max_nprobe = static_cast<int>(config.max_nprobe());
  limits.max_filter_ids = static_cast<int64_t>(config.max_filter_ids());
  if (config.has_default_refine_factor()) {
    limits.default_refine_factor =
        static_cast<int>(config.default_refine_factor());
  }
  limits.max_refine_factor = static_cast<int>(config.max_refine_factor());
  limits.filter.max_conditions =
      static_cast<int64_t>(config.max_filter_conditions());
  limits.filter.max_depth = static_cast<int>(config.max_filter_depth());
  limits.max_text_bytes = static_cast<int64_t>(config.max_text_bytes());
  limits.max_get_ids = static_cast<int64_t>(config.max_get_ids());
  return limits;
}

ShardFront::Options ShardFrontOptionsFrom(const ServerConfig& config) {
  ShardFront::Options options;
  options.targets.assign(config.shard_targets().begin(),
                         config.shard_targets().end());
  options.poll_interval = absl::Milliseconds(config.shard_poll_interval_ms());
  options.retry_pushback_ms = static_cast<int>(config.retry_pushback_ms());
  options.slow_request = absl::Milliseconds(config.slow_request_ms());
  options.max_send_message_bytes =
      static_cast<int64_t>(config.max_send_message_bytes());
  return options;
}

KnnServiceImpl::Options KnnServiceOptionsFrom(const ServerConfig& config) {
  KnnServiceImpl::Options options;
  options.limits = LimitsConfigFrom(config);
  options.max_receive_message_bytes =
      static_cast<int64_t>(config.max_receive_message_bytes());
  options.max_send_message_bytes =
      static_cast<int64_t>(config.max_send_message_bytes());
  options.retry_pushback_ms = static_cast<int>(config.retry_pushback_ms());
  options.max_batch_rows = static_cast<int64_t>(config.max_batch_rows());
  options.slow_request = absl::Milliseconds(config.slow_request_ms());
  return options;
}

TokenAuthenticator::Options AuthOptionsFrom(const ServerConfig& config) {
  TokenAuthenticator::Options options;
  options.search_token_file = config.search_token_file();
  options.admin_token_file = config.admin_token_file();
  return options;
}

MemoryBudget::Options MemoryBudgetOptionsFrom(const ServerConfig& config) {
  MemoryBudget::Options options;
  options.configured_limit_bytes =
      static_cast<int64_t>(config.memory_limit_bytes());
  options.headroom_bytes = static_cast<int64_t>(config.memory_headroom_bytes());
  options.max_inflight_bytes = static_cast<int64_t>(config.max_inflight_bytes());
  options.max_inflight_bytes_configured = config.has_max_inflight_bytes();
  options.inflight_bytes_limit_percent =
      static_cast<int>(config.inflight_bytes_limit_percent());
  options.use_precomputed_table = config.use_precomputed_table();
  options.limits = LimitsConfigFrom(config);
  options.max_batch_rows = static_cast<int64_t>(config.max_batch_rows());
  return options;
}

VersionPreparation::Options PreparationOptionsFrom(const ServerConfig& config) {
  VersionPreparation::Options options;
  options.warmup_queries = static_cast<int>(config.warmup_queries());
  options.warmup_nprobe = static_cast<int>(config.warmup_nprobe());
  options.limits = LimitsConfigFrom(config);
  options.canary_queries_path = config.canary_queries_path();
  options.canary_ground_truth_path = config.canary_ground_truth_path();
  options.canary_k = static_cast<int>(config.canary_k());
  options.canary_min_recall = config.canary_min_recall();
  return options;
}

IndexManager::Options IndexManagerOptionsFrom(const ServerConfig& config) {
  IndexManager::Options options;
  options.index_path = config.index_path();
  options.load.use_precomputed_table = config.use_precomputed_table();
  options.load.filter_cache_bytes =
      static_cast<int64_t>(config.filter_cache_bytes());
  options.load.probe_in_subprocess = config.probe_index_in_subprocess();
  options.load.probe_timeout = absl::Seconds(config.index_probe_timeout_s());
  options.load.vectors = !config.load_vectors()     ? VectorsPolicy::kIgnore
                         : config.require_vectors() ? VectorsPolicy::kRequired
                                                    : VectorsPolicy::kOptional;
  options.poll_interval = absl::Milliseconds(config.index_poll_interval_ms());
  options.keep_previous_versions =
      static_cast<int>(config.keep_previous_versions());
  absl::StatusOr<IndexManager::Options::ChecksumCheck> check =
      ParseChecksumCheck(config.checksum_check());
  if (check.ok()) options.checksum_check = *check;
  return options;
}

ConnectionLimits ConnectionLimitsFrom(const ServerConfig& config,
                                      int64_t byte_budget) {
  constexpr int64_t kFramingBytes = int64_t{64} << 10;
  ConnectionLimits limits;
  limits.memory_quota_bytes =
      config.grpc_memory_quota_bytes() != 0
          ? static_cast<int64_t>(config.grpc_memory_quota_bytes())
          : static_cast<int64_t>(config.memory_headroom_bytes() / 2);
  int64_t max_message =
      static_cast<int64_t>(config.max_receive_message_bytes());
  if (limits.memory_quota_bytes > 0) {  // 0: memory_headroom_bytes 0, no quota
    max_message = std::min(max_message, limits.memory_quota_bytes / 2);
  }
  if (byte_budget > 0) {
    max_message = std::min(max_message, byte_budget + kFramingBytes);
  }
  limits.max_receive_message_bytes = std::max<int64_t>(max_message, 1024);
  limits.max_send_message_bytes =
      static_cast<int64_t>(config.max_send_message_bytes());
  limits.max_connection_age_ms = config.max_connection_age_ms();
  limits.max_connection_age_grace_ms = config.max_connection_age_grace_ms();
  limits.max_concurrent_streams =
      static_cast<int>(config.max_concurrent_streams());
  limits.keepalive_min_ping_interval_ms =
      static_cast<int>(config.keepalive_min_ping_interval_ms());
  limits.keepalive_permit_without_calls =
      config.keepalive_permit_without_calls();
  limits.max_metadata_bytes = static_cast<int>(config.max_metadata_bytes());
  return limits;
}

ConnectionLimits SmallPortLimits(const ConnectionLimits& search) {
  constexpr int64_t kSmall = int64_t{4} << 20;
  ConnectionLimits limits = search;
  limits.memory_quota_bytes =
      search.memory_quota_bytes == 0
          ? kSmall
          : std::min(search.memory_quota_bytes, kSmall);
  return limits;
}

HttpServer::Options HttpServerOptionsFrom(const ServerConfig& config,
                                          const ConnectionLimits& limits) {
  HttpServer::Options options;
  options.address = config.http_listen_address();
  options.threads = static_cast<int>(config.http_threads());
  options.max_connections = static_cast<int>(config.http_max_connections());
  options.max_connections_per_ip =
      static_cast<int>(config.http_max_connections_per_ip());
  // Without memory_headroom_bytes (no gRPC quota either), room for two of
  // the largest bodies.
  options.memory_quota_bytes =
      config.http_memory_quota_bytes() != 0
          ? static_cast<int64_t>(config.http_memory_quota_bytes())
      : config.memory_headroom_bytes() >= 4
          ? static_cast<int64_t>(config.memory_headroom_bytes() / 4)
          : 2 * limits.max_receive_message_bytes;
  options.max_body_bytes =
      config.http_max_body_bytes() != 0
          ? static_cast<int64_t>(config.http_max_body_bytes())
          : std::min(limits.max_receive_message_bytes,
                     options.memory_quota_bytes / 2);
  options.max_header_bytes = limits.max_metadata_bytes;
  options.read_timeout = absl::Milliseconds(config.http_read_timeout_ms());
  options.idle_timeout = absl::Milliseconds(config.http_idle_timeout_ms());
  options.max_connection_age = absl::Milliseconds(limits.max_connection_age_ms);
  options.tls.cert_file = config.tls_cert_file();
  options.tls.key_file = config.tls_key_file();
  options.tls.client_ca_file = config.tls_client_ca_file();
  options.tls.require_client_cert = config.require_client_cert();
  options.tls.reload_interval = absl::Seconds(config.tls_reload_interval_s());
  return options;
}

}  // namespace knnd
