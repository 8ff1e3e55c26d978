// The Options of every component, made from a ServerConfig: the one place
// where config fields are mapped to the components' own names and units.
// Server (server.cc) only wires what these return; ValidateConfig calls the
// components' own ValidateOptions on them, so each range is checked once.
// config.proto's defaults are the production defaults, and every Options
// struct defaults to what an empty ServerConfig gives here
// (server_options_test checks each field), so that a component a test
// builds from its own defaults runs as it does in knnd.
//
// Thread-safety: pure functions.
#ifndef KNND_CONFIG_SERVER_OPTIONS_H_
#define KNND_CONFIG_SERVER_OPTIONS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "knnd/lifecycle/index_manager.h"
#include "knnd/lifecycle/version_preparation.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/http_server.h"
#include "knnd/rpc/knn_service.h"
#include "knnd/rpc/listener.h"
#include "knnd/rpc/shard_front.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/batcher.h"
#include "knnd/serving/heap_trimmer.h"
#include "knnd/serving/malloc_settings.h"
#include "knnd/serving/memory_budget.h"
#include "knnd/serving/search_limits.h"
#include "knnd/serving/worker_pool.h"
#include "knnd/v1/config.pb.h"

namespace knnd {

// checksum_check: "background", "before_serving" or "off"; anything else is
// INVALID_ARGUMENT naming the value and the choices.
absl::StatusOr<IndexManager::Options::ChecksumCheck> ParseChecksumCheck(
    absl::string_view value);

MallocSettings MallocSettingsFrom(const knnd::v1::ServerConfig& config);
HeapTrimmer::Options HeapTrimmerOptionsFrom(
    const knnd::v1::ServerConfig& config);
WorkerPool::Options WorkerPoolOptionsFrom(const knnd::v1::ServerConfig& config);
AdmissionGate::Options GateOptionsFrom(const knnd::v1::ServerConfig& config);
Metrics::Options MetricsOptionsFrom(const knnd::v1::ServerConfig& config);
Batcher::Options BatcherOptionsFrom(const knnd::v1::ServerConfig& config);
LimitsConfig LimitsConfigFrom(const knnd::v1::ServerConfig& config);
// Without shard_token (read by the server from shard_token_file).
ShardFront::Options ShardFrontOptionsFrom(const knnd::v1::ServerConfig& config);
KnnServiceImpl::Options KnnServiceOptionsFrom(
    const knnd::v1::ServerConfig& config);
TokenAuthenticator::Options AuthOptionsFrom(
    const knnd::v1::ServerConfig& config);
MemoryBudget::Options MemoryBudgetOptionsFrom(
    const knnd::v1::ServerConfig& config);
VersionPreparation::Options PreparationOptionsFrom(
    const knnd::v1::ServerConfig& config);
// Without serving_changed, the one up-call the server connects (the memory
// budget and the version preparation are IndexManager::Parts); `config`
// must have passed ValidateConfig (checksum_check is then known).
IndexManager::Options IndexManagerOptionsFrom(
    const knnd::v1::ServerConfig& config);
// The search port's limits. `byte_budget` is the admission gate's budget
// in force (0: unbounded): the gRPC memory quota is grpc_memory_quota_bytes
// or half of memory_headroom_bytes (none when that is 0), and the largest
// message accepted is
// max_receive_message_bytes lowered to half the quota and to the budget
// plus 64 KiB of framing (docs/sizing.md).
ConnectionLimits ConnectionLimitsFrom(const knnd::v1::ServerConfig& config,
                                      int64_t byte_budget);
// The HTTP/JSON listener's options (http_* fields, and the TLS files of
// listen_address), with `limits` the search port's (ConnectionLimitsFrom):
// the body limit defaults to its largest message, within half the HTTP
// memory quota (a quarter of memory_headroom_bytes by default).
HttpServer::Options HttpServerOptionsFrom(const knnd::v1::ServerConfig& config,
                                          const ConnectionLimits& limits);
// The health-only and admin ports' limits: the search port's, with a gRPC
// memory quota of at most 4 MiB (their messages are small), so that they
// add little to the search port's bound.
ConnectionLimits SmallPortLimits(const ConnectionLimits& search);

}  // namespace knnd

#endif  // KNND_CONFIG_SERVER_OPTIONS_H_
