// One source of defaults: every component's Options made from an empty
// ServerConfig (config.proto's defaults, what knnd runs with) equal the
// Options' own defaults, so that a component a test builds with default
// Options behaves as it does in knnd. FieldsAre names every field: a field
// added to one of these structs fails to compile here until its default is
// checked.
#include "knnd/config/server_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace knnd {
namespace {

using ::knnd::v1::ServerConfig;
using ::testing::FieldsAre;
using ::testing::IsNull;
using ::testing::StrEq;

auto LimitsAre(const LimitsConfig& d) {
  return FieldsAre(d.max_k, d.max_queries_per_request, d.default_nprobe,
                   d.max_nprobe, d.max_filter_ids, d.default_refine_factor,
                   d.max_refine_factor,
                   FieldsAre(d.filter.max_conditions, d.filter.max_depth),
                   d.max_text_bytes, d.max_get_ids);
}

TEST(ServerOptions, WorkerPoolDefaultsAreTheConfigs) {
  const WorkerPool::Options d;
  EXPECT_THAT(WorkerPoolOptionsFrom(ServerConfig()),
              FieldsAre(d.num_threads, d.omp_threads_per_worker,
                        d.nice_increment, StrEq(d.thread_name)));
}

TEST(ServerOptions, AdmissionGateDefaultsAreTheConfigs) {
  const AdmissionGate::Options d;
  EXPECT_THAT(GateOptionsFrom(ServerConfig()),
              FieldsAre(d.max_inflight_queries, d.max_inflight_bytes,
                        d.max_queue_time, d.num_workers));
}

TEST(ServerOptions, BatcherDefaultsAreTheConfigs) {
  const Batcher::Options d;
  EXPECT_THAT(BatcherOptionsFrom(ServerConfig()),
              FieldsAre(d.max_batch_rows, d.coalesce, d.max_queue_delay_us,
                        d.inline_max_rows));
}

TEST(ServerOptions, MemoryBudgetDefaultsAreTheConfigs) {
  const MemoryBudget::Options d;
  EXPECT_THAT(MemoryBudgetOptionsFrom(ServerConfig()),
              FieldsAre(d.configured_limit_bytes, d.headroom_bytes,
                        d.max_inflight_bytes, d.max_inflight_bytes_configured,
                        d.inflight_bytes_limit_percent, d.use_precomputed_table,
                        LimitsAre(d.limits), d.max_batch_rows, d.proc_root,
                        d.cgroup_root));
}

TEST(ServerOptions, HeapTrimmerAndMallocDefaultsAreTheConfigs) {
  const HeapTrimmer::Options trimmer;
  EXPECT_THAT(HeapTrimmerOptionsFrom(ServerConfig()),
              FieldsAre(trimmer.interval, trimmer.min_free_bytes));
  const MallocSettings settings;
  EXPECT_THAT(MallocSettingsFrom(ServerConfig()),
              FieldsAre(settings.arena_max, settings.mmap_threshold_bytes,
                        settings.top_pad_bytes));
}

TEST(ServerOptions, LimitsDefaultsAreTheConfigs) {
  EXPECT_THAT(LimitsConfigFrom(ServerConfig()), LimitsAre(LimitsConfig()));
}

TEST(ServerOptions, MetricsDefaultsAreTheConfigs) {
  const Metrics::Options d;
  EXPECT_THAT(
      MetricsOptionsFrom(ServerConfig()),
      FieldsAre(d.listen_address,
                FieldsAre(d.process.proc_root, d.process.cgroup_root,
                          d.process.max_residency_scan_bytes_per_scrape)));
}

TEST(ServerOptions, RpcDefaultsAreTheConfigs) {
  const KnnServiceImpl::Options service;
  EXPECT_THAT(
      KnnServiceOptionsFrom(ServerConfig()),
      FieldsAre(LimitsAre(service.limits), service.max_receive_message_bytes,
                service.max_send_message_bytes, service.retry_pushback_ms,
                service.max_batch_rows, service.slow_request));
  const ShardFront::Options front;
  EXPECT_THAT(
      ShardFrontOptionsFrom(ServerConfig()),
      FieldsAre(front.targets, front.shard_token, IsNull(), front.poll_interval,
                front.default_deadline, front.retry_pushback_ms,
                front.max_shard_response_bytes, front.max_send_message_bytes,
                front.slow_request));
  const TokenAuthenticator::Options auth;
  EXPECT_THAT(AuthOptionsFrom(ServerConfig()),
              FieldsAre(auth.search_token_file, auth.admin_token_file));
}

TEST(ServerOptions, HttpServerDefaultsAreTheConfigs) {
  const HttpServer::Options d;
  const HttpTls::Files& tls = d.tls;
  EXPECT_THAT(
      HttpServerOptionsFrom(ServerConfig(),
                            ConnectionLimitsFrom(ServerConfig(), 0)),
      FieldsAre(d.address, StrEq(d.role), d.threads, d.max_connections,
                d.max_connections_per_ip, d.max_body_bytes,
                d.memory_quota_bytes, d.max_header_bytes, d.read_timeout,
                d.idle_timeout, d.max_connection_age,
                FieldsAre(tls.cert_file, tls.key_file, tls.client_ca_file,
                          tls.require_client_cert, tls.reload_interval),
                IsNull()));
}

TEST(ServerOptions, VersionPreparationDefaultsAreTheConfigs) {
  const VersionPreparation::Options d;
  EXPECT_THAT(PreparationOptionsFrom(ServerConfig()),
              FieldsAre(d.warmup_queries, d.warmup_nprobe, LimitsAre(d.limits),
                        d.canary_queries_path, d.canary_ground_truth_path,
                        d.canary_k, d.canary_min_recall));
}

TEST(ServerOptions, IndexManagerDefaultsAreTheConfigs) {
  const IndexManager::Options d;
  const LoadOptions& load = d.load;
  EXPECT_THAT(IndexManagerOptionsFrom(ServerConfig()),
              FieldsAre(d.index_path,
                        FieldsAre(load.version, load.use_precomputed_table,
                                  load.probe_in_subprocess, load.probe_timeout,
                                  load.verify_checksum, load.vectors,
                                  load.filter_cache_bytes, IsNull()),
                        d.poll_interval, IsNull(), d.keep_previous_versions,
                        d.checksum_check, IsNull()));
}

}  // namespace
}  // namespace knnd
