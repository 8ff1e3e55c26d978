// Metrics: every Prometheus metric knnd exports, in one place, and the HTTP
// endpoint that serves them (GET <listen_address>/metrics). Code records
// through the small named functions below; nothing else touches
// prometheus-cpp. Request durations are in seconds, in buckets from 100 us
// to 10 s.
//
// Besides what is recorded, a scrape reads live values: queries and bytes in
// flight (AdmissionGate), work units queued (WorkerPool), and the process
// and cgroup memory (ProcessMetrics).
//
// Ownership: owns the registry, the collectors and the exposer; the load
// readings call into their owners (the gate, the pool), which must outlive
// it (or at least its exposer).
// Thread-safety: every method is safe to call concurrently.
#ifndef KNND_MONITORING_METRICS_H_
#define KNND_MONITORING_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/monitoring/process_metrics.h"
#include "knnd/monitoring/reject_reason.h"

namespace knnd {

class Metrics {
 public:
  struct Options {
    // host:port of the /metrics endpoint; port 0 picks a free one.
    std::string listen_address = "0.0.0.0:9090";
    ProcessMetrics::Options process;
  };

  // The RPCs of knnd.v1.KnnService (the grpc_method label).
  enum class Rpc { kSearch, kGetIndexInfo, kGet };
  // The front door a call came through (the protocol label of the RPC
  // series): gRPC, or HTTP/JSON (docs/api.md, "HTTP/JSON").
  enum class Protocol { kGrpc, kHttp };
  // Where the served version's CRC-32 check stands (knnd_index_checksum):
  // nothing to check against (no sidecar or vectors header) or
  // checksum_check "off"; read in the background while it serves; verified;
  // failed (the version was withdrawn).
  enum class ChecksumState { kUnchecked, kPending, kVerified, kFailed };

  // The live load a scrape reads (every function set; thread-safe).
  struct LoadReadings {
    std::function<int64_t()> queries_in_flight;
    std::function<int64_t()> bytes_in_flight;
    std::function<int64_t()> max_inflight_bytes;  // the budget in force
    std::function<int64_t()> work_units_queued;
  };

  static absl::StatusOr<std::unique_ptr<Metrics>> Create(
      const Options& options, LoadReadings load);

  // Stops serving /metrics first (StopExposer).
  ~Metrics();

  // Binds listen_address and serves /metrics from then on.
  absl::Status StartExposer();
  // Closes the /metrics port and joins its threads; idempotent. civetweb's
  // accept thread polls its socket in 2 s quanta and reads its stop flag
  // only between them, so stopping alone would take up to 2 s (every knnd
  // exit, every test server); this connects to the port while civetweb
  // stops, which ends the poll at once.
  void StopExposer();
  // The bound port (useful with port 0); 0 before StartExposer().
  int port() const;

  // A new snapshot is served: replaces the knnd_index_* series and follows
  // its file's mapping and page-cache residency.
  void SetIndexInfo(const IndexInfo& info);
  // One index version loaded and either published (ok) or refused.
  void RecordIndexReload(bool ok);
  // knnd_index_serving: 1 while a version serves searches, 0 before the
  // first and after a withdrawal (the knnd_index_* series then still
  // describe the withdrawn version).
  void SetIndexServing(bool serving);
  void SetIndexChecksumState(ChecksumState state);

  // One finished call, whatever its outcome; `handling` runs from arrival to
  // the status being sent.
  void RecordRpc(Rpc rpc, Protocol protocol, absl::StatusCode code,
                 absl::Duration handling);
  // A Search refused before reaching the workers.
  void RecordRejection(RejectReason reason);
  // An admitted Search after its last work unit: its size and where its time
  // went (queue: admitted -> first unit started; execution: -> last unit
  // finished).
  void RecordSearchWork(int64_t queries, absl::Duration queue,
                        absl::Duration execution);
  // Rows of one FAISS search call that ran.
  void RecordBatchRows(int64_t rows);
  // Time one FAISS call with refine_factor > 0 spent on exact distances.
  void RecordRerank(absl::Duration duration);
  // One search call of a hybrid request (SearchRequest.texts): the time of
  // its vector retriever (null for texts alone) and of its text retriever.
  void RecordRetrievers(const absl::Duration* vector, absl::Duration text);
  // A Search answered with `bytes` of payloads (SearchResponse.payloads).
  void RecordPayloadBytes(int64_t bytes);
  // A filtered Search that asked the serving version's filter cache: found
  // its filter compiled (`hit`) or not; the cache then held `entries`
  // filters in `bytes`.
  void RecordFilterCache(bool hit, int64_t bytes, int64_t entries);

  // A front of shards (shard_targets): creates the per-shard series for
  // `targets` (once, before any other shard call below; series labelled
  // by target).
  void AddShardTargets(const std::vector<std::string>& targets);
  // One call to the shard at `target` (its index in AddShardTargets'
  // list) ended with `code` after `duration`.
  void RecordShardCall(int target, absl::StatusCode code,
                       absl::Duration duration);
  // The last poll of `target`: answered as part of the set or not, and the
  // version it serves (0: unknown).
  void SetShardState(int target, bool up, int64_t serving_version);

 private:
  static constexpr int kNumRpcs = 3;
  static constexpr int kNumProtocols = 2;
  static constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED
  static constexpr int kNumRejectReasons =
      static_cast<int>(RejectReason::kNotReady) + 1;

  explicit Metrics(const Options& options);
  // Create()'s steps, one family of series each, into the registry.
  void RegisterRpcs(prometheus::Registry& r);
  void RegisterSearches(prometheus::Registry& r);
  void RegisterFiltersAndReloads(prometheus::Registry& r);
  void RegisterIndex(prometheus::Registry& r);

  const Options options_;
  const std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessMetrics> process_;
  std::shared_ptr<prometheus::Collectable> load_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // null until started

  // By rpc, protocol and code; by rpc and protocol.
  std::array<
      std::array<std::array<prometheus::Counter*, kNumCodes>, kNumProtocols>,
      kNumRpcs>
      handled_{};
  std::array<std::array<prometheus::Histogram*, kNumProtocols>, kNumRpcs>
      handling_{};
  std::array<prometheus::Counter*, kNumRejectReasons> rejected_{};
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* execution_ = nullptr;
  prometheus::Histogram* request_queries_ = nullptr;
  prometheus::Histogram* batch_rows_ = nullptr;
  prometheus::Histogram* rerank_ = nullptr;
  prometheus::Histogram* retriever_vector_ = nullptr;
  prometheus::Histogram* retriever_text_ = nullptr;
  prometheus::Counter* payload_bytes_ = nullptr;
  prometheus::Counter* filter_cache_hits_ = nullptr;
  prometheus::Counter* filter_cache_misses_ = nullptr;
  prometheus::Gauge* filter_cache_bytes_ = nullptr;
  prometheus::Gauge* filter_cache_entries_ = nullptr;
  prometheus::Gauge* filter_cache_limit_ = nullptr;
  prometheus::Counter* reloads_ok_ = nullptr;
  prometheus::Counter* reloads_failed_ = nullptr;

  absl::Mutex index_mu_;
  prometheus::Family<prometheus::Gauge>* index_info_family_ = nullptr;
  prometheus::Gauge* index_info_ ABSL_GUARDED_BY(index_mu_) = nullptr;
  prometheus::Gauge* index_vectors_ = nullptr;
  prometheus::Gauge* index_dimensions_ = nullptr;
  prometheus::Gauge* index_nlist_ = nullptr;
  prometheus::Gauge* index_code_size_ = nullptr;
  prometheus::Gauge* index_file_size_ = nullptr;
  prometheus::Gauge* index_heap_ = nullptr;
  prometheus::Gauge* index_precomputed_table_ = nullptr;
  prometheus::Gauge* index_load_duration_ = nullptr;
  prometheus::Gauge* index_load_time_ = nullptr;
  prometheus::Gauge* vectors_file_size_ = nullptr;
  prometheus::Gauge* id_table_file_size_ = nullptr;
  prometheus::Gauge* payloads_file_size_ = nullptr;
  prometheus::Gauge* text_file_size_ = nullptr;
  prometheus::Gauge* attributes_file_size_ = nullptr;
  prometheus::Gauge* index_serving_ = nullptr;
  // By ChecksumState: 1 for the served version's state, 0 for the others.
  prometheus::Gauge* index_checksum_[4] = {};

  struct ShardSeries {
    std::array<prometheus::Counter*, kNumCodes> calls{};
    prometheus::Histogram* duration = nullptr;
    prometheus::Gauge* up = nullptr;
    prometheus::Gauge* version = nullptr;
  };
  std::vector<ShardSeries> shards_;  // set once, before the front starts
};

}  // namespace knnd

#endif  // KNND_MONITORING_METRICS_H_
