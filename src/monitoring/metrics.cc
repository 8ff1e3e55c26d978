#include "knnd/monitoring/metrics.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "knnd/monitoring/build_info.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr char kService[] = "knnd.v1.KnnService";

// From 100 us (a single query at low nprobe) to 10 s (a client deadline).
const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,     2.5,   5,    10};
  return *b;
}

// Powers of two up to 16384 (4x the default max_inflight_queries).
const prometheus::Histogram::BucketBoundaries& RowBuckets() {
  static const auto* b = [] {
    auto* v = new prometheus::Histogram::BucketBoundaries;
    for (double rows = 1; rows <= 16384; rows *= 2) v->push_back(rows);
    return v;
  }();
  return *b;
}

const char* RpcName(Metrics::Rpc rpc) {
  switch (rpc) {
    case Metrics::Rpc::kSearch:
      return "Search";
    case Metrics::Rpc::kGetIndexInfo:
      return "GetIndexInfo";
    case Metrics::Rpc::kGet:
      return "Get";
  }
  return "unknown";
}

// Scrape-time view of the load on the gate and the worker queue.
class LoadCollector : public prometheus::Collectable {
 public:
  explicit LoadCollector(Metrics::LoadReadings load) : load_(std::move(load)) {}

  std::vector<MetricFamily> Collect() const override {
    return {Gauge("knnd_queries_in_flight",
                  "Query rows admitted and not finished (queued or searching).",
                  static_cast<double>(load_.queries_in_flight())),
            Gauge("knnd_estimated_bytes_in_flight",
                  "Estimated request memory admitted and not finished, in "
                  "bytes (the gate's max_inflight_bytes budget).",
                  static_cast<double>(load_.bytes_in_flight())),
            Gauge("knnd_max_inflight_bytes",
                  "The gate's byte budget in force (0: unbounded): "
                  "max_inflight_bytes, or its share of the memory limit left "
                  "after the index heap and the headroom.",
                  static_cast<double>(load_.max_inflight_bytes())),
            Gauge("knnd_work_units_queued",
                  "Work units waiting for a free worker thread.",
                  static_cast<double>(load_.work_units_queued()))};
  }

 private:
  static MetricFamily Gauge(const char* name, const char* help, double value) {
    ClientMetric metric;
    metric.gauge.value = value;
    return MetricFamily{name, help, MetricType::Gauge, {metric}};
  }

  const Metrics::LoadReadings load_;
};

}  // namespace

Metrics::Metrics(const Options& options)
    : options_(options),
      registry_(std::make_shared<prometheus::Registry>()) {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(
    const Options& options, LoadReadings load) {
  if (!load.queries_in_flight || !load.bytes_in_flight ||
      !load.max_inflight_bytes || !load.work_units_queued) {
    return absl::InvalidArgumentError(
        "metrics need every load reading (gate and worker pool)");
  }
  std::unique_ptr<Metrics> m(new Metrics(options));
  prometheus::Registry& r = *m->registry_;
  m->process_ = std::make_shared<ProcessMetrics>(options.process);
  m->load_ = std::make_shared<LoadCollector>(std::move(load));

  m->RegisterRpcs(r);
  m->RegisterSearches(r);
  m->RegisterFiltersAndReloads(r);
  m->RegisterIndex(r);
  return m;
}

// gRPC's own series: every method and code, and the refusals by reason.
void Metrics::RegisterRpcs(prometheus::Registry& r) {
  // Every method x code pair exists from the start, so that rate() and
  // ratios see a 0 instead of a missing series before the first error.
  auto& handled = BuildCounter()
                      .Name("grpc_server_handled_total")
                      .Help(
                          "RPCs completed on the server, by method, protocol "
                          "(grpc or http) and gRPC status code.")
                      .Register(r);
  auto& handling = BuildHistogram()
                       .Name("grpc_server_handling_seconds")
                       .Help(
                           "Time from an RPC's arrival to its status being "
                           "sent, in seconds, rejections included.")
                       .Register(r);
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    for (int p = 0; p < kNumProtocols; ++p) {
      prometheus::Labels labels = {
          {"grpc_service", kService},
          {"grpc_method", RpcName(static_cast<Rpc>(rpc))},
          {"grpc_type", "unary"},
          {"protocol", p == 0 ? "grpc" : "http"}};
      handling_[rpc][p] = &handling.Add(labels, SecondsBuckets());
      for (int code = 0; code < kNumCodes; ++code) {
        labels["grpc_code"] =
            absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
        handled_[rpc][p][code] = &handled.Add(labels);
      }
    }
  }

  auto& rejected =
      BuildCounter()
          .Name("knnd_search_rejected_total")
          .Help("Search requests refused before reaching the workers, by "
                "reason.")
          .Register(r);
  for (int reason = 0; reason < kNumRejectReasons; ++reason) {
    rejected_[reason] = &rejected.Add(
        {{"reason", RejectReasonName(static_cast<RejectReason>(reason))}});
  }
}

// What searches spend: queue and run time, rows, re-ranking, retrievers,
// payloads.
void Metrics::RegisterSearches(prometheus::Registry& r) {
  queue_ = &BuildHistogram()
                .Name("knnd_search_queue_duration_seconds")
                .Help(
                    "Time an admitted Search waited for its first work "
                    "unit to start, in seconds.")
                .Register(r)
                .Add({}, SecondsBuckets());
  execution_ = &BuildHistogram()
                    .Name("knnd_search_execution_duration_seconds")
                    .Help(
                        "Time from a Search's first work unit starting to "
                        "its last finishing, in seconds.")
                    .Register(r)
                    .Add({}, SecondsBuckets());
  request_queries_ = &BuildHistogram()
                          .Name("knnd_search_request_queries")
                          .Help("Query vectors per admitted Search request.")
                          .Register(r)
                          .Add({}, RowBuckets());
  batch_rows_ = &BuildHistogram()
                     .Name("knnd_search_batch_rows")
                     .Help("Query rows per FAISS search call executed.")
                     .Register(r)
                     .Add({}, RowBuckets());
  rerank_ = &BuildHistogram()
                 .Name("knnd_search_rerank_duration_seconds")
                 .Help(
                     "Time one search call with refine_factor > 0 spent "
                     "computing exact distances from the raw vectors "
                     "and keeping the k best, in seconds.")
                 .Register(r)
                 .Add({}, SecondsBuckets());

  auto& retrievers =
      BuildHistogram()
          .Name("knnd_search_retriever_duration_seconds")
          .Help(
              "Time one search call of a hybrid request (texts) spent in "
              "each retriever, vector (the vector search for its window) "
              "and text (BM25 over the text index), in seconds.")
          .Register(r);
  retriever_vector_ =
      &retrievers.Add({{"retriever", "vector"}}, SecondsBuckets());
  retriever_text_ = &retrievers.Add({{"retriever", "text"}}, SecondsBuckets());

  payload_bytes_ = &BuildCounter()
                        .Name("knnd_search_payload_bytes_total")
                        .Help(
                            "Bytes of payloads (JSON objects) sent in "
                            "Search answers that asked for them.")
                        .Register(r)
                        .Add({});
}

// The filter cache and the reloads of index versions.
void Metrics::RegisterFiltersAndReloads(prometheus::Registry& r) {
  auto& filter_lookups =
      BuildCounter()
          .Name("knnd_filter_cache_lookups_total")
          .Help("Filtered searches that looked their filter up in the serving "
                "version's cache of compiled filters (filter_cache_bytes): "
                "hit = its bitmap was used as kept, miss = it was compiled "
                "or searched through a column's bounds.")
          .Register(r);
  filter_cache_hits_ = &filter_lookups.Add({{"result", "hit"}});
  filter_cache_misses_ = &filter_lookups.Add({{"result", "miss"}});
  filter_cache_bytes_ =
      &BuildGauge()
           .Name("knnd_filter_cache_bytes")
           .Help(
               "Bytes of compiled filters (bitmaps and keys) the serving "
               "version's filter cache holds, as of the last filtered "
               "search; at most knnd_index_filter_cache_limit_bytes.")
           .Register(r)
           .Add({});
  filter_cache_entries_ =
      &BuildGauge()
           .Name("knnd_filter_cache_entries")
           .Help(
               "Compiled filters the serving version's filter cache holds, "
               "as of the last filtered search.")
           .Register(r)
           .Add({});

  auto& reloads =
      BuildCounter()
          .Name("knnd_index_reloads_total")
          .Help("Index versions loaded, the first included: ok = checked and "
                "published, failed = refused while the previous version kept "
                "serving.")
          .Register(r);
  reloads_ok_ = &reloads.Add({{"result", "ok"}});
  reloads_failed_ = &reloads.Add({{"result", "failed"}});
}

// The build and the served index: sizes, load, files, checksum state.
void Metrics::RegisterIndex(prometheus::Registry& r) {
  const BuildInfo& build = GetBuildInfo();
  BuildGauge()
      .Name("knnd_build_info")
      .Help("Always 1; labels say which knnd and which FAISS build run.")
      .Register(r)
      .Add({{"version", build.version},
            {"git", build.git_commit},
            {"faiss_version", build.faiss_version},
            {"faiss_opt", build.faiss_compile_options},
            {"blas_kernels", build.blas_kernels}})
      .Set(1);

  index_info_family_ =
      &BuildGauge()
           .Name("knnd_index_info")
           .Help("Always 1 for the index being served; labels identify it.")
           .Register(r);
  auto index_gauge = [&r](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  index_vectors_ =
      index_gauge("knnd_index_vectors", "Vectors in the served index.");
  index_dimensions_ =
      index_gauge("knnd_index_dimensions", "Dimension of the indexed vectors.");
  index_nlist_ = index_gauge("knnd_index_nlist",
                             "Inverted lists (IVF cells) of the index.");
  index_code_size_ = index_gauge("knnd_index_code_size_bytes",
                                 "Bytes of one encoded vector (PQ code).");
  index_file_size_ = index_gauge("knnd_index_file_size_bytes",
                                 "Size of the served index file in bytes.");
  index_heap_ = index_gauge(
      "knnd_index_heap_bytes",
      "Heap memory of the index in bytes: coarse centroids, PQ codebooks, "
      "pre-transforms, the precomputed table and the bound of its filter "
      "cache.");
  filter_cache_limit_ = index_gauge(
      "knnd_index_filter_cache_limit_bytes",
      "The most bytes the served version's cache of compiled filters may "
      "hold (filter_cache_bytes; part of knnd_index_heap_bytes); 0 without "
      "attributes or with the cache off.");
  index_precomputed_table_ =
      index_gauge("knnd_index_precomputed_table_bytes",
                  "Heap bytes of the IVF-PQ precomputed table (part of "
                  "knnd_index_heap_bytes; 0 when turned off).");
  index_load_duration_ =
      index_gauge("knnd_index_load_duration_seconds",
                  "Time it took to load and check the served index, in "
                  "seconds.");
  index_load_time_ = index_gauge(
      "knnd_index_load_timestamp_seconds",
      "When the served index was loaded, in seconds since the Unix epoch.");
  vectors_file_size_ = index_gauge(
      "knnd_index_vectors_file_size_bytes",
      "Size of the raw-vectors file used for exact re-ranking, in bytes; 0 "
      "when the index is served without one.");
  id_table_file_size_ = index_gauge(
      "knnd_index_id_table_file_size_bytes",
      "Size of the id table (INDEX.ids) of an index built with its own ids, "
      "mapped read-only (file-backed memory), in bytes; 0 when the index's "
      "lists hold the ids themselves.");
  payloads_file_size_ = index_gauge(
      "knnd_index_payloads_file_size_bytes",
      "Size of the payload file (INDEX.payloads) of an index built with "
      "payloads, mapped read-only (file-backed memory), in bytes; 0 when the "
      "index has none.");
  text_file_size_ = index_gauge(
      "knnd_index_text_file_size_bytes",
      "Size of the text index (INDEX.text, knnctl build --text) that text "
      "queries search, mapped read-only (file-backed memory), in bytes; 0 "
      "when the index has none.");
  attributes_file_size_ = index_gauge(
      "knnd_index_attributes_file_size_bytes",
      "Size of the attribute store (INDEX.attrs) that request filters are "
      "compiled over, mapped read-only (file-backed memory), in bytes; 0 "
      "when the index has no attributes.");
  index_serving_ = index_gauge(
      "knnd_index_serving",
      "1 while an index version serves searches; 0 before the first one and "
      "after a version is withdrawn (its checksum check failed), when the "
      "other knnd_index_* series still describe the withdrawn version.");
  auto& checksum =
      BuildGauge()
          .Name("knnd_index_checksum")
          .Help("State of the served version's CRC-32 check, 1 on its state: "
                "unchecked (no sidecar or vectors header, or checksum_check "
                "off), pending (read in the background while it serves), "
                "verified, failed (withdrawn).")
          .Register(r);
  const char* const states[] = {"unchecked", "pending", "verified", "failed"};
  for (int i = 0; i < 4; ++i) {
    index_checksum_[i] = &checksum.Add({{"state", states[i]}});
  }
}

absl::Status Metrics::StartExposer() {
  // civetweb reports a failed bind by throwing from the constructor.
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options_.listen_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", options_.listen_address,
                     " (address in use or invalid): ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(process_);
  exposer_->RegisterCollectable(load_);
  return absl::OkStatus();
}

Metrics::~Metrics() { StopExposer(); }

namespace {

// A TCP connection to `port` on the host of `listen_address` (host:port),
// closed once made (or after 50 ms): a numeric host as it is, anything
// else (a wildcard, a name, which is not resolved again here) through
// IPv4's loopback, or IPv6's for "::".
void TouchPort(const std::string& listen_address, int port) {
  const size_t colon = listen_address.rfind(':');
  std::string host =
      colon == std::string::npos ? "" : listen_address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (host.empty() || host == "0.0.0.0" ||
      getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0) {
    if (getaddrinfo("127.0.0.1", service.c_str(), &hints, &found) != 0) {
      return;
    }
  }
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family,
                          a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                          a->ai_protocol);
    if (fd < 0) continue;
    bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      connected = poll(&p, 1, 50) == 1 && (p.revents & POLLOUT) != 0;
    }
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

void Metrics::StopExposer() {
  if (exposer_ == nullptr) return;
  const int bound = port();
  // The destructor runs mg_stop(), which sets civetweb's stop flag and
  // waits for its accept thread; a connection arriving after the flag is
  // set wakes that thread's poll(). One arriving before it is accepted
  // and closed like any client's, so connect until the stop is done.
  absl::Notification stopped;
  std::thread stopper;
  try {
    stopper = std::thread([this, &stopped] {
      exposer_.reset();
      stopped.Notify();
    });
  } catch (const std::system_error& e) {
    // No thread to spare (at exit, under a thread limit): stop it here and
    // wait for civetweb's quantum.
    spdlog::warn("stopping /metrics without waking it: {}", e.what());
    exposer_.reset();
    return;
  }
  while (bound > 0 &&
         !stopped.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
    TouchPort(options_.listen_address, bound);
  }
  stopper.join();
}

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::SetIndexInfo(const IndexInfo& info) {
  {
    absl::MutexLock lock(&index_mu_);
    if (index_info_ != nullptr) index_info_family_->Remove(index_info_);
    index_info_ = &index_info_family_->Add(
        {{"version", absl::StrCat(info.version)},
         {"metric", MetricName(info.metric)},
         {"factory", info.factory.empty() ? info.index_type : info.factory}});
    index_info_->Set(1);
  }
  index_vectors_->Set(static_cast<double>(info.ntotal));
  index_dimensions_->Set(info.dim);
  index_nlist_->Set(static_cast<double>(info.nlist));
  index_code_size_->Set(static_cast<double>(info.code_size_bytes));
  index_file_size_->Set(static_cast<double>(info.file_bytes));
  index_heap_->Set(static_cast<double>(info.heap_bytes));
  index_precomputed_table_->Set(
      static_cast<double>(info.precomputed_table_bytes));
  filter_cache_limit_->Set(static_cast<double>(info.filter_cache_bytes));
  // A new version starts with an empty cache.
  filter_cache_bytes_->Set(0);
  filter_cache_entries_->Set(0);
  index_load_duration_->Set(absl::ToDoubleSeconds(info.load_duration));
  index_load_time_->Set(absl::ToDoubleSeconds(info.load_time - absl::UnixEpoch()));
  // A path that no longer resolves only costs the residency series; the
  // index itself is already loaded and served.
  if (absl::Status s = process_->TrackIndexFile(info.path); !s.ok()) {
    spdlog::warn("index residency metrics unavailable: {}", s.ToString());
  }
  vectors_file_size_->Set(static_cast<double>(info.vectors_file_bytes));
  id_table_file_size_->Set(static_cast<double>(info.id_table_file_bytes));
  payloads_file_size_->Set(static_cast<double>(info.payloads_file_bytes));
  attributes_file_size_->Set(static_cast<double>(info.attributes_file_bytes));
  text_file_size_->Set(static_cast<double>(info.text_file_bytes));
  if (absl::Status s = process_->TrackVectorsFile(info.vectors_path);
      !s.ok()) {
    spdlog::warn("vectors residency metrics unavailable: {}", s.ToString());
  }
}

void Metrics::RecordIndexReload(bool ok) {
  (ok ? reloads_ok_ : reloads_failed_)->Increment();
}

void Metrics::SetIndexServing(bool serving) {
  index_serving_->Set(serving ? 1 : 0);
}

void Metrics::SetIndexChecksumState(ChecksumState state) {
  absl::MutexLock lock(&index_mu_);  // one state at 1, whoever sets it
  for (int i = 0; i < 4; ++i) {
    index_checksum_[i]->Set(i == static_cast<int>(state) ? 1 : 0);
  }
}

void Metrics::RecordRpc(Rpc rpc, Protocol protocol, absl::StatusCode code,
                        absl::Duration handling) {
  const int r = static_cast<int>(rpc), p = static_cast<int>(protocol);
  int c = static_cast<int>(code);
  if (c < 0 || c >= kNumCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  handled_[r][p][c]->Increment();
  handling_[r][p]->Observe(absl::ToDoubleSeconds(handling));
}

void Metrics::RecordRejection(RejectReason reason) {
  rejected_[static_cast<int>(reason)]->Increment();
}

void Metrics::RecordSearchWork(int64_t queries, absl::Duration queue,
                               absl::Duration execution) {
  request_queries_->Observe(static_cast<double>(queries));
  queue_->Observe(absl::ToDoubleSeconds(queue));
  execution_->Observe(absl::ToDoubleSeconds(execution));
}

void Metrics::RecordBatchRows(int64_t rows) {
  batch_rows_->Observe(static_cast<double>(rows));
}

void Metrics::RecordRerank(absl::Duration duration) {
  rerank_->Observe(absl::ToDoubleSeconds(duration));
}

void Metrics::RecordRetrievers(const absl::Duration* vector,
                               absl::Duration text) {
  if (vector != nullptr) {
    retriever_vector_->Observe(absl::ToDoubleSeconds(*vector));
  }
  retriever_text_->Observe(absl::ToDoubleSeconds(text));
}

void Metrics::RecordPayloadBytes(int64_t bytes) {
  payload_bytes_->Increment(static_cast<double>(bytes));
}

void Metrics::RecordFilterCache(bool hit, int64_t bytes, int64_t entries) {
  (hit ? filter_cache_hits_ : filter_cache_misses_)->Increment();
  filter_cache_bytes_->Set(static_cast<double>(bytes));
  filter_cache_entries_->Set(static_cast<double>(entries));
}

void Metrics::AddShardTargets(const std::vector<std::string>& targets) {
  prometheus::Registry& r = *registry_;
  auto& calls =
      BuildCounter()
          .Name("knnd_shard_calls_total")
          .Help("Calls of a front of shards to each shard, by gRPC status "
                "code.")
          .Register(r);
  auto& duration =
      BuildHistogram()
          .Name("knnd_shard_call_seconds")
          .Help("Time from a front's call to a shard to its answer, in "
                "seconds.")
          .Register(r);
  auto& up = BuildGauge()
                 .Name("knnd_shard_up")
                 .Help("1 when the shard answered the front's last poll as "
                       "a shard of the set, else 0.")
                 .Register(r);
  auto& version = BuildGauge()
                      .Name("knnd_shard_serving_version")
                      .Help("The index version the shard last said it "
                            "serves (0: unknown).")
                      .Register(r);
  shards_.assign(targets.size(), {});
  for (size_t i = 0; i < targets.size(); ++i) {
    const prometheus::Labels labels = {{"target", targets[i]}};
    for (int code = 0; code < kNumCodes; ++code) {
      prometheus::Labels with_code = labels;
      with_code["grpc_code"] =
          absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
      shards_[i].calls[code] = &calls.Add(with_code);
    }
    shards_[i].duration = &duration.Add(labels, SecondsBuckets());
    shards_[i].up = &up.Add(labels);
    shards_[i].version = &version.Add(labels);
  }
}

void Metrics::RecordShardCall(int target, absl::StatusCode code,
                              absl::Duration duration) {
  ShardSeries& series = shards_[target];
  const int c = static_cast<int>(code);
  series.calls[c >= 0 && c < kNumCodes ? c
                                       : static_cast<int>(absl::StatusCode::kUnknown)]
      ->Increment();
  series.duration->Observe(absl::ToDoubleSeconds(duration));
}

void Metrics::SetShardState(int target, bool up, int64_t serving_version) {
  shards_[target].up->Set(up ? 1 : 0);
  shards_[target].version->Set(static_cast<double>(serving_version));
}

}  // namespace knnd
