// Shared helpers of knnd's tests: seeded data, small IVF-PQ files written
// with FAISS itself or with knnd's own builder, exact reference answers,
// files and temporary directories, and an in-process server with the calls
// tests make to it.
//
// Thread-safety: the functions share no state; a TempDir belongs to the
// test that made it.
#ifndef KNND_TESTS_TEST_UTIL_H_
#define KNND_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <faiss/Index.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/base/metric.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/listener.h"
#include "knnd/server.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/v1/config.pb.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd::testing {

class TempDir;

// ---- data and indexes ----

// n x d standard-normal float32 values from a fixed seed, row-major,
// grouped around `clusters` centres so that IVF lists are uneven, as in
// real data.
std::vector<float> MakeData(int64_t n, int d, uint32_t seed, int clusters = 32);

struct IndexSpec {
  int64_t n = 5000;
  int d = 32;
  std::string factory = "IVF32,PQ8";
  bool inner_product = false;
  int nprobe = 4;  // saved in the file
  uint32_t seed = 1234;
  // The vectors get ids first_id .. first_id + n - 1 (FAISS's own numbering
  // when 0), e.g. to tell which index answered.
  int64_t first_id = 0;
};

// Trains and fills an index as described, writes it to `path` with FAISS's
// writer and returns the base vectors.
std::vector<float> WriteIndex(const std::string& path, const IndexSpec& spec);

// Ids of version v of VersionSpec() start at v * kVersionIdStride.
inline constexpr int64_t kVersionIdStride = 1000000;

// Version `version` of a small index (1000 vectors of 16 dimensions,
// IVF16,PQ4x4, seeded with the version) whose ids are version *
// kVersionIdStride + i, so that every answer says which version produced
// it.
IndexSpec VersionSpec(int64_t version);

// Writes `spec` to a staging file in `tmp` and publishes it into the
// versions directory `dir` (PublishVersion, as `knnctl publish` does); the
// version number it got, 0 (and a test failure) when publishing failed.
int64_t PublishIndex(const TempDir& tmp, const std::string& dir,
                     const IndexSpec& spec);

// An index as `knnctl build` makes one: knnd's IndexBuilder over
// MakeData(n, d, seed) (or the rows given), added in two batches (the second's
// ids continue the first's), written with a stored nprobe of 4 and a metadata
// sidecar whose source is "MakeData(n, d, seed)".
struct BuildSpec {
  int64_t n = 4000;
  int d = 32;
  uint32_t seed = 7;
  // Non-empty (n x d): these rows instead of MakeData(n, d, seed)'s.
  std::vector<float> rows;
  Metric metric = Metric::kL2;
  std::string factory = "IVF32,PQ8";
  // Set: the raw-vectors file VectorsPath(path) of this dtype is written
  // too, with the rows the index holds (L2-normalised for cosine).
  absl::optional<VectorsDtype> vectors;
  // Non-empty (n entries): the index's own ids, row i holding ids[i], in
  // the id table IdTablePath(path), as `knnctl build --ids` writes them.
  std::vector<int64_t> ids;
  // Non-empty (n entries): row i's payload line (JSON), in
  // PayloadPath(path), as `knnctl build --payloads` writes them.
  std::vector<std::string> payloads;
  // Non-empty (with payloads): the text index TextIndexPath(path) of this
  // payload field, as `knnctl build --text` writes it.
  std::string text_field;
  // Set (n rows): the attribute store AttributeStorePath(path), as
  // `knnctl build --attributes` writes it.
  absl::optional<AttributeColumns> attributes;
};

// Seeded attributes of `n` rows, every type once:
//   "u"      integer, uniform in [0, 100000) on every row: the range
//            [0, 100000 * s) admits a fraction s of the rows
//   "genre"  keyword, one of "news", "sport", "arts", "tech"; none on
//            every 7th row
//   "tags"   keyword_list, 0 to 3 of "t0" .. "t9"
//   "score"  float in [0, 1); none on every 5th row
//   "ts"     timestamp (epoch microseconds), a day apart from 2020-01-01
AttributeColumns MakeAttributes(int64_t n, uint32_t seed);

// Builds `spec` into `path` (one OpenMP thread: tests share the machine,
// and threads spinning on busy cores made a build take 17 s instead of 2 s)
// and returns the base vectors as generated.
std::vector<float> BuildIndex(const std::string& path, const BuildSpec& spec);

// Writes `x` (rows of `dim`) to the raw-vectors file `path` in two appends,
// so that the payload's CRC-32 runs across them.
absl::Status WriteVectorsFile(const std::string& path,
                              const std::vector<float>& x, int dim,
                              VectorsDtype dtype);

// FAISS's own reading of `path` into memory (no mmap), for reference
// searches.
std::unique_ptr<faiss::Index> ReadFaissIndex(const std::string& path);

// FAISS's own search of `index` with its IVF nprobe set to `nprobe`, on one
// OpenMP thread (FAISS splits batches by thread count): the reference that
// knnd's answers are compared with.
void FaissSearch(faiss::Index& index, int nprobe,
                 const std::vector<float>& queries, int k,
                 std::vector<float>* distances, std::vector<int64_t>* ids);

// FaissSearch of `path` read by ReadFaissIndex.
void ReferenceSearch(const std::string& path, const std::vector<float>& queries,
                     int k, int nprobe, std::vector<float>* distances,
                     std::vector<int64_t>* ids);

// IndexSnapshot::Load expected to succeed; null (and a test failure) when
// it does not.
std::unique_ptr<IndexSnapshot> LoadSnapshot(const std::string& path,
                                            const LoadOptions& options = {});

struct SearchResults {
  std::vector<float> distances;
  std::vector<int64_t> ids;
};

// One IndexSnapshot::Search of `queries` (rows of the index's dim) with
// the given parameters, expected to succeed.
SearchResults SearchSnapshot(const IndexSnapshot& snapshot,
                             const std::vector<float>& queries, int k,
                             int nprobe, int refine_factor = 0,
                             absl::Span<const int64_t> allowed_ids = {},
                             const RowBitmap* allowed_rows = nullptr,
                             const ColumnRange* allowed_range = nullptr);
// The same with a filter the caller prepared (prepared_filter.h): its plan
// runs as it is.
SearchResults SearchPrepared(const IndexSnapshot& snapshot,
                             const std::vector<float>& queries, int k,
                             int nprobe, int refine_factor,
                             const PreparedFilter* filter,
                             absl::Span<const int64_t> allowed_ids = {});

// ---- exact answers, in double precision and independent of FAISS ----

// Rows of `dim` scaled to unit L2 norm.
std::vector<float> NormalizedRows(std::vector<float> x, int dim);

// The distance `metric` ranks query `q` and stored vector `v` by: squared
// L2, the inner product, or for cosine the inner product of `q` normalised
// with `v` (stored normalised, as the index holds it).
double ReferenceDistance(Metric metric, const float* q, const float* v,
                         int dim);

// The ids of the k closest rows of `base` to each row of `queries` by
// ReferenceDistance, closest first, ties by id.
std::vector<int64_t> BruteForceNeighbors(const std::vector<float>& base,
                                         const std::vector<float>& queries,
                                         int dim, int k, Metric metric);

// ---- files and commands ----

// A fresh directory under TEST_TMPDIR (else /tmp). It owns the directory:
// destruction removes it with everything in it. Used by the one test (or
// suite) that made it; not for concurrent use.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// The whole of `path`; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Replaces `path` with `contents`, creating missing parent directories; a
// test failure when it cannot.
void WriteFile(const std::string& path, const std::string& contents);

// Sets the byte at `offset` of `path` to `byte`.
void PokeByte(const std::string& path, int64_t offset, char byte);

// XORs the byte `offset` bytes before the end of `path` with 0x5a. Near the
// end of an IVF-PQ file that is a stored code or id: the file stays
// structurally valid, and only its CRC-32 tells.
void FlipByteFromEnd(const std::string& path, int64_t offset);

// Runs `command` with /bin/sh; its exit status (-1 when it did not exit),
// with its standard output appended to `output` (add "2>&1" for both).
int RunCommand(const std::string& command, std::string* output);

// The pid of a child process that ran and exited: a process that is gone
// (for the files killed runs leave behind, named by pid).
int DeadPid();

// ---- an in-process server ----

// A free TCP port on 127.0.0.1 (bound then released; racy only in theory).
int FreePort();

// Metrics for components tested without a server: every load reading 0,
// /metrics (when started) on a free port.
std::unique_ptr<Metrics> IdleMetrics();

// A config for an in-process server on a free loopback port.
knnd::v1::ServerConfig TestConfig(const std::string& index_path);

// The config of a front of shards over `targets` (TestConfig otherwise),
// polling them every 100 ms, without an admin port.
knnd::v1::ServerConfig FrontConfig(const std::vector<std::string>& targets);

// Expects the config check to refuse `config` with INVALID_ARGUMENT whose
// message contains `why`.
void ExpectConfigRefused(const knnd::v1::ServerConfig& config,
                         const std::string& why);

// A started, loaded in-process server and a stub connected to it; it owns
// the server, which stops when it goes. The channel and stub are gRPC's,
// safe to use from several threads.
struct RunningServer {
  std::unique_ptr<Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub;
  std::string address;
};
RunningServer StartServer(const knnd::v1::ServerConfig& config);
// Waits (at most 20 s) until the front of shards `front` reports the set
// ready (its GetIndexInfo answers).
bool WaitReady(const RunningServer& front);

// The built index `index` served whole, split into `count` shards
// (ShardIndexFile, knnctl shard's work) each served by its own Server, and
// a front over them in the shards' order, ready; expects each step to
// succeed.
struct ServedShardSet {
  RunningServer whole;
  std::vector<RunningServer> shards;
  RunningServer front;
};
ServedShardSet ServeShardSet(const std::string& index, int count);

// A plaintext channel to `address` with a subchannel of its own, so that no
// earlier failed connection (and its reconnect backoff) is shared with it.
std::shared_ptr<grpc::Channel> FreshChannel(const std::string& address,
                                            grpc::ChannelArguments args = {});

// `service` alone on a free 127.0.0.1 port, plaintext, from `queues`
// completion queues (the listener's `port` says which port), their
// threads named `thread_name` and polling `poll_us` after each event
// (ListenerSpec); its stub connects through FreshChannel.
absl::StatusOr<Listener> ServeOnLoopback(
    AsyncService* service, int queues = 1, int poll_us = 0,
    const char* thread_name = "knnd-grpc",
    std::function<bool()> may_poll = nullptr);

// Moves `r`'s results from the repeated fields to the bytes fields a
// results_as_bytes request gets (ids_i64le, distances_f32le,
// approx_distances_f32le).
void MoveResultsToBytes(knnd::v1::SearchResponse& r);

// A search of `queries` (row-major float vectors) for k neighbours.
knnd::v1::SearchRequest MakeSearchRequest(const std::vector<float>& queries,
                                          int k);

// Search through `stub`, with a context of its own unless `context` is
// given; the response is dropped unless `response` is given.
grpc::Status CallSearch(knnd::v1::KnnService::Stub& stub,
                        const knnd::v1::SearchRequest& request,
                        knnd::v1::SearchResponse* response = nullptr,
                        grpc::ClientContext* context = nullptr);

// grpc.health.v1 Check of `service` ("" for the server as a whole) over
// `channel`; UNKNOWN when the check does not answer within `timeout`.
grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel,
    const std::string& service = "",
    absl::Duration timeout = absl::Seconds(30));

}  // namespace knnd::testing

#endif  // KNND_TESTS_TEST_UTIL_H_
