#include "knnd/config/config.h"

#include <cstdint>
#include <fstream>
#include <sstream>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/config/server_options.h"
#include "knnd/index/index_sharding.h"
#include "knnd/rpc/search_request_codec.h"

namespace knnd {
namespace {

// Collects the parser's messages instead of letting them go to stderr.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors.push_back(absl::StrCat(line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  std::vector<std::string> errors;
};

// A memory quota field: 0 (`zero_means`) or 1 MiB to 1 TiB.
absl::Status CheckQuota(const char* field, uint64_t bytes,
                        const char* zero_means) {
  if (bytes == 0 ||
      (bytes >= (uint64_t{1} << 20) && bytes <= (uint64_t{1} << 40))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is ", bytes, "; must be 0 (", zero_means, ") or between ",
      uint64_t{1} << 20, " and ", uint64_t{1} << 40));
}

}  // namespace

absl::StatusOr<knnd::v1::ServerConfig> ParseConfig(const std::string& text,
                                                   const std::string& origin) {
  knnd::v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config ", origin, ": ", absl::StrJoin(errors.errors, "; ")));
  }
  return config;
}

absl::StatusOr<knnd::v1::ServerConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open config file ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

absl::Status ValidateConfig(const knnd::v1::ServerConfig& c) {
  // Before the HTTP listener's own checks, which take the quota in force.
  if (absl::Status s =
          CheckQuota("http_memory_quota_bytes", c.http_memory_quota_bytes(),
                     "a quarter of memory_headroom_bytes");
      !s.ok()) {
    return s;
  }
  // The components' own checks, on the options made from this config: one
  // range check per field, wherever the field is used.
  for (absl::Status s :
       {WorkerPool::ValidateOptions(WorkerPoolOptionsFrom(c)),
        Batcher::ValidateOptions(BatcherOptionsFrom(c)),
        HeapTrimmer::ValidateOptions(HeapTrimmerOptionsFrom(c)),
        ParseChecksumCheck(c.checksum_check()).status(),
        c.http_listen_address().empty()
            ? absl::OkStatus()
            : HttpServer::ValidateOptions(
                  HttpServerOptionsFrom(c, ConnectionLimitsFrom(c, 0)))}) {
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field ", s.message()));
    }
  }
  auto out_of_range = [](const char* field, uint64_t value, uint64_t lo,
                         uint64_t hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field ", field, "=", value, " is outside [", lo, ", ", hi,
        "]"));
  };
  if (c.shard_targets_size() > 0) {
    if (!c.index_path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index_path (", c.index_path(), ") and shard_targets exclude each "
          "other: a front of shards serves no index of its own"));
    }
    if (c.shard_targets_size() > kMaxShards) {
      return out_of_range("shard_targets count",
                          static_cast<uint64_t>(c.shard_targets_size()), 1,
                          kMaxShards);
    }
    for (const std::string& target : c.shard_targets()) {
      if (target.empty()) {
        return absl::InvalidArgumentError(
            "config field shard_targets holds an empty target");
      }
    }
  }
  if (c.shard_tls_cert_file().empty() != c.shard_tls_key_file().empty()) {
    return absl::InvalidArgumentError(
        "shard_tls_cert_file and shard_tls_key_file go together: set both "
        "(the front's client certificate) or neither");
  }
  if (!c.shard_tls_cert_file().empty() && c.shard_tls_ca_file().empty()) {
    return absl::InvalidArgumentError(
        "shard_tls_cert_file needs shard_tls_ca_file (TLS to the shards)");
  }
  if (c.shard_poll_interval_ms() < 50 ||
      c.shard_poll_interval_ms() > 3600000) {
    return out_of_range("shard_poll_interval_ms", c.shard_poll_interval_ms(),
                        50, 3600000);
  }
  if (c.max_k() < 1 || c.max_k() > 100000) {
    return out_of_range("max_k", c.max_k(), 1, 100000);
  }
  if (c.max_queries_per_request() < 1) {
    return out_of_range("max_queries_per_request", c.max_queries_per_request(),
                        1, c.max_inflight_queries());
  }
  if (c.max_inflight_queries() < c.max_queries_per_request()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_inflight_queries=", c.max_inflight_queries(),
        " is below max_queries_per_request=", c.max_queries_per_request(),
        ": a full request could never be admitted"));
  }
  if (c.inflight_bytes_limit_percent() < 1 ||
      c.inflight_bytes_limit_percent() > 100) {
    return out_of_range("inflight_bytes_limit_percent",
                        c.inflight_bytes_limit_percent(), 1, 100);
  }
  if (c.malloc_arena_max() > 1024) {
    return out_of_range("malloc_arena_max", c.malloc_arena_max(), 0, 1024);
  }
  // glibc refuses thresholds above DEFAULT_MMAP_THRESHOLD_MAX (32 MiB).
  if (c.malloc_mmap_threshold_bytes() > (uint32_t{32} << 20)) {
    return out_of_range("malloc_mmap_threshold_bytes",
                        c.malloc_mmap_threshold_bytes(), 0, uint32_t{32} << 20);
  }
  if (c.malloc_top_pad_bytes() > (uint32_t{32} << 20)) {
    return out_of_range("malloc_top_pad_bytes", c.malloc_top_pad_bytes(), 0,
                        uint32_t{32} << 20);
  }
  if (c.max_queue_time_ms() > 3600000) {
    return out_of_range("max_queue_time_ms", c.max_queue_time_ms(), 0, 3600000);
  }
  if (c.shutdown_delay_ms() > 300000) {
    return out_of_range("shutdown_delay_ms", c.shutdown_delay_ms(), 0, 300000);
  }
  if (c.drain_grace_period_ms() > 3600000) {
    return out_of_range("drain_grace_period_ms", c.drain_grace_period_ms(), 0,
                        3600000);
  }
  if (c.index_probe_timeout_s() < 1 || c.index_probe_timeout_s() > 86400) {
    return out_of_range("index_probe_timeout_s", c.index_probe_timeout_s(), 1,
                        86400);
  }
  for (const auto& [name, bytes] :
       {std::pair<const char*, uint64_t>{"max_receive_message_bytes",
                                         c.max_receive_message_bytes()},
        {"max_send_message_bytes", c.max_send_message_bytes()}}) {
    if (bytes < 1024 || bytes > (uint64_t{1} << 31) - 1) {
      return out_of_range(name, bytes, 1024, (uint64_t{1} << 31) - 1);
    }
  }
  if (absl::Status s =
          CheckQuota("grpc_memory_quota_bytes", c.grpc_memory_quota_bytes(),
                     "half of memory_headroom_bytes");
      !s.ok()) {
    return s;
  }
  if (c.filter_cache_bytes() > (uint64_t{1} << 40)) {
    return out_of_range("filter_cache_bytes", c.filter_cache_bytes(), 0,
                        uint64_t{1} << 40);
  }
  if (c.grpc_poll_us() > 10000) {
    return out_of_range("grpc_poll_us", c.grpc_poll_us(), 0, 10000);
  }
  if (c.max_connection_age_ms() > INT32_MAX) {
    return out_of_range("max_connection_age_ms", c.max_connection_age_ms(), 0,
                        INT32_MAX);
  }
  if (c.max_connection_age_grace_ms() > INT32_MAX) {
    return out_of_range("max_connection_age_grace_ms",
                        c.max_connection_age_grace_ms(), 0, INT32_MAX);
  }
  if (c.listen_address().empty()) {
    return absl::InvalidArgumentError("config field listen_address is empty");
  }
  if (c.metrics_listen_address().empty()) {
    return absl::InvalidArgumentError(
        "config field metrics_listen_address is empty");
  }
  if (c.tls_cert_file().empty() != c.tls_key_file().empty()) {
    return absl::InvalidArgumentError(
        "config fields tls_cert_file and tls_key_file go together: set both "
        "(TLS) or neither (plaintext)");
  }
  if (c.tls_cert_file().empty() && !c.tls_client_ca_file().empty()) {
    return absl::InvalidArgumentError(
        "config field tls_client_ca_file needs tls_cert_file and tls_key_file");
  }
  if (c.tls_cert_file().empty() && !c.health_listen_address().empty()) {
    return absl::InvalidArgumentError(
        "config field health_listen_address is for a TLS listen_address; "
        "without TLS, probes use listen_address itself");
  }
  if (c.tls_reload_interval_s() < 1) {
    return out_of_range("tls_reload_interval_s", c.tls_reload_interval_s(), 1,
                        UINT32_MAX);
  }
  if (c.max_concurrent_streams() < 1 || c.max_concurrent_streams() > 1000000) {
    return out_of_range("max_concurrent_streams", c.max_concurrent_streams(),
                        1, 1000000);
  }
  if (c.keepalive_min_ping_interval_ms() > INT32_MAX) {
    return out_of_range("keepalive_min_ping_interval_ms",
                        c.keepalive_min_ping_interval_ms(), 0, INT32_MAX);
  }
  if (c.max_metadata_bytes() < 1024 || c.max_metadata_bytes() > 1048576) {
    return out_of_range("max_metadata_bytes", c.max_metadata_bytes(), 1024,
                        1048576);
  }
  if (c.keep_previous_versions() > 16) {
    return out_of_range("keep_previous_versions", c.keep_previous_versions(),
                        0, 16);
  }
  if (c.canary_k() < 1 || c.canary_k() > 1024) {
    return out_of_range("canary_k", c.canary_k(), 1, 1024);
  }
  if (!(c.canary_min_recall() >= 0.0 && c.canary_min_recall() <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field canary_min_recall=", c.canary_min_recall(),
        " is outside [0, 1]"));
  }
  if (c.canary_queries_path().empty() &&
      !c.canary_ground_truth_path().empty()) {
    return absl::InvalidArgumentError(
        "config field canary_ground_truth_path is set without "
        "canary_queries_path");
  }
  if (c.metrics_residency_scan_bytes() == 0) {
    return absl::InvalidArgumentError(
        "config field metrics_residency_scan_bytes=0 must be positive");
  }
  if (c.max_refine_factor() > 1024) {
    return out_of_range("max_refine_factor", c.max_refine_factor(), 0, 1024);
  }
  if (c.default_refine_factor() > c.max_refine_factor()) {
    return out_of_range("default_refine_factor", c.default_refine_factor(), 0,
                        c.max_refine_factor());
  }
  // Deeper filters are not read at all (search_request_codec.h).
  if (c.max_filter_depth() < 1 || c.max_filter_depth() > kMaxFilterDepthLimit) {
    return out_of_range("max_filter_depth", c.max_filter_depth(), 1,
                        kMaxFilterDepthLimit);
  }
  if (c.max_text_bytes() < 1 || c.max_text_bytes() > (1u << 24)) {
    return out_of_range("max_text_bytes", c.max_text_bytes(), 1, 1 << 24);
  }
  if (c.max_get_ids() < 1 || c.max_get_ids() > (1u << 20)) {
    return out_of_range("max_get_ids", c.max_get_ids(), 1, 1 << 20);
  }
  return absl::OkStatus();
}

}  // namespace knnd
