// knnctl: the command-line companion of knnd.
//   knnctl build  --input FILE --output INDEX [--metric l2|ip|cosine]
//                 [--factory STR | --nlist N --m M] [--train_size N]
//                 [--ids FILE] [--nprobe P] [--keep_vectors
//                 [--vectors_dtype f32|f16]]
//   knnctl eval   --index INDEX --queries FILE (--ground_truth FILE |
//                 --base FILE) [--k 10] [--target_recall 0.95]
//                 [--nprobes LIST] [--refine_factors LIST]
//   knnctl search --addr HOST:PORT (--queries FILE | --random N) [--k 10]
//                 [--nprobe P] [--refine_factor R] [--batch N] [--show N]
//   knnctl info   (--addr HOST:PORT | --index FILE)
//   knnctl health --addr HOST:PORT      exit 0 when SERVING, 1 otherwise
//   knnctl publish --index FILE --dir DIR   DIR/<next N>/ for knnd to load
//   knnctl reload [--addr HOST:ADMIN_PORT] [--pin N]   load / roll back now
//   knnctl versions [--addr HOST:ADMIN_PORT]           what is on disk, served
// Calls to a secured knnd: --tls_ca (+ --tls_cert/--tls_key for mTLS) and
// --token_file.
// Exit codes: 0 done, 1 health: not serving, 2 any error (message on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/base/percentile.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_probe.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/vectors_file.h"

ABSL_FLAG(absl::optional<std::string>, addr, absl::nullopt,
          "knnd address, HOST:PORT: the search API (default localhost:50051), "
          "or for reload and versions the admin API (default "
          "localhost:50052, knnd's admin_listen_address).");
ABSL_FLAG(std::string, token_file, "",
          "File whose first token line (blank lines and # comments skipped) "
          "is sent as 'authorization: Bearer <token>' on every call: knnd's "
          "search_token_file / admin_token_file. Never a flag value, so the "
          "token stays out of the process list.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed knnd's certificate: connect with TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "With --tls_ca: PEM client certificate chain (mutual TLS).");
ABSL_FLAG(std::string, tls_key, "", "With --tls_cert: its PEM private key.");
ABSL_FLAG(absl::optional<int64_t>, pin, absl::nullopt,
          "reload: pin version N and serve it (rollback); 0 unpins and "
          "serves the latest. Unset: serve the latest (or pinned) version.");
ABSL_FLAG(std::string, queries, "",
          "Query vectors: .npy, .fvecs, .bvecs or IDX (.gz allowed).");
ABSL_FLAG(int64_t, random, 0, "Send N seeded random queries instead.");
ABSL_FLAG(int64_t, limit, 0, "Use at most N rows of --queries; 0 = all.");
ABSL_FLAG(int, k, 10, "Neighbours per query.");
ABSL_FLAG(int, nprobe, 0,
          "search: lists to visit, 0 = the server's default; build: the default "
          "stored in the file, 0 = nlist/32.");
ABSL_FLAG(int64_t, batch, 256,
          "Queries per request (search) or per search call (eval).");
ABSL_FLAG(int64_t, show, 3, "Print the neighbours of the first N queries.");
ABSL_FLAG(int, timeout_ms, 10000, "Deadline of each call, in ms.");
ABSL_FLAG(std::string, index, "",
          "Index file (info: read it locally; eval: the index to measure).");
ABSL_FLAG(std::string, service, "", "health: service name to check.");
ABSL_FLAG(std::string, dir, "",
          "publish: versions directory knnd serves (--index DIR there).");
ABSL_FLAG(std::string, input, "",
          "build: vectors to index: .npy (float32, 2-D, C order), .fvecs, "
          ".bvecs or IDX (.gz allowed).");
ABSL_FLAG(std::string, output, "", "build: index file to write.");
ABSL_FLAG(std::string, metric, "l2",
          "build: l2, ip (inner product) or cosine (vectors and, in knnd, "
          "queries are L2-normalised).");
ABSL_FLAG(std::string, factory, "",
          "build: FAISS factory string of an IVF-PQ index, e.g. "
          "'IVF1024,PQ32' or 'OPQ32,IVF1024,PQ32'; default from --nlist/--m.");
ABSL_FLAG(int64_t, nlist, 0,
          "build: inverted lists; 0 = about 4*sqrt(N), a power of two, at "
          "most N/39.");
ABSL_FLAG(int, m, 0,
          "build: PQ sub-quantizers (bytes per vector), must divide dim; 0 = "
          "the largest divisor <= 64 leaving sub-vectors of >= 4 dims.");
ABSL_FLAG(int64_t, train_size, 0,
          "build: rows sampled (seeded) for training; 0 = min(N, "
          "max(50*nlist, 65536)).");
ABSL_FLAG(std::string, ids, "",
          "build: int64/int32 .npy or .ivecs of one id per input row "
          "(default: row numbers); eval: the same file, to map exact "
          "neighbours computed from --base to those ids.");
ABSL_FLAG(int64_t, add_batch, 65536,
          "build: rows added per batch (bounds the temporary memory of add).");
ABSL_FLAG(uint32_t, seed, 1234, "build: seed of the training sample and k-means.");
ABSL_FLAG(std::string, base, "",
          "eval: the indexed vectors, for exact ground truth when no "
          "--ground_truth is given.");
ABSL_FLAG(std::string, ground_truth, "",
          "eval: true neighbour ids per query (.ivecs or int .npy, closest "
          "first).");
ABSL_FLAG(double, target_recall, 0.95,
          "eval: report the smallest nprobe whose recall@k reaches this.");
ABSL_FLAG(int, threads, 0,
          "build/eval: OpenMP threads FAISS may use; 0 = all cores. OpenBLAS "
          "is pinned to one thread, as in knnd.");
ABSL_FLAG(std::string, nprobes, "",
          "eval: comma-separated nprobe values; default powers of two up to "
          "nlist.");
ABSL_FLAG(int, refine_factor, -1,
          "search: exact re-ranking of refine_factor * k candidates; -1 = "
          "the server's default, 0 = off.");
ABSL_FLAG(bool, keep_vectors, false,
          "build: also write the raw vectors to INDEX.vectors (row = id) so "
          "knnd can re-rank IVF-PQ candidates exactly (refine_factor).");
ABSL_FLAG(std::string, vectors_dtype, "f32",
          "build: element type of INDEX.vectors: f32, or f16 (half the "
          "bytes, distances rounded to ~3 decimal digits).");
ABSL_FLAG(std::string, refine_factors, "",
          "eval: comma-separated refine_factor values to sweep with each "
          "nprobe (0 = no re-ranking); default 0,1,2,4,8,16 when the index "
          "has INDEX.vectors, else 0.");

namespace {

using knnd::Percentile;
using knnd::v1::KnnService;

int Fail(const std::string& message) {
  std::fprintf(stderr, "knnctl: %s\n", message.c_str());
  return 2;
}

int FailRpc(const char* what, const grpc::Status& status) {
  return Fail(absl::StrCat(what, " failed: ",
                           absl::StatusCodeToString(static_cast<absl::StatusCode>(
                               status.error_code())),
                           ": ", status.error_message()));
}

// The whole of a file, or an error naming it and the flag.
std::string ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "knnctl: --%s %s: cannot read: %s\n", flag,
                 path.c_str(), std::strerror(errno));
    std::exit(2);
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::shared_ptr<grpc::Channel> Connect(
    const std::string& default_addr = "localhost:50051") {
  const std::string addr = absl::GetFlag(FLAGS_addr).value_or(default_addr);
  if (absl::GetFlag(FLAGS_tls_ca).empty()) {
    return grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  }
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFlagFile("tls_ca", absl::GetFlag(FLAGS_tls_ca));
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    tls.pem_cert_chain = ReadFlagFile("tls_cert", absl::GetFlag(FLAGS_tls_cert));
    tls.pem_private_key = ReadFlagFile("tls_key", absl::GetFlag(FLAGS_tls_key));
  }
  return grpc::CreateChannel(addr, grpc::SslCredentials(tls));
}

// The bearer token of --token_file ("" without one); read once.
const std::string& Token() {
  static const std::string* token = [] {
    auto* t = new std::string;
    const std::string path = absl::GetFlag(FLAGS_token_file);
    if (path.empty()) return t;
    for (absl::string_view line :
         absl::StrSplit(ReadFlagFile("token_file", path), '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      *t = std::string(line);
      break;
    }
    if (t->empty()) {
      std::fprintf(stderr, "knnctl: --token_file %s holds no token\n",
                   path.c_str());
      std::exit(2);
    }
    return t;
  }();
  return *token;
}

constexpr char kAdminAddr[] = "localhost:50052";

// Every call's deadline, and its bearer token when --token_file is given.
void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!Token().empty()) context.AddMetadata("authorization", "Bearer " + Token());
}

const char* MetricOf(knnd::v1::Metric metric) {
  switch (metric) {
    case knnd::v1::METRIC_L2: return "l2";
    case knnd::v1::METRIC_INNER_PRODUCT: return "inner_product";
    case knnd::v1::METRIC_COSINE: return "cosine";
    default: return "unspecified";
  }
}

int Search() {
  auto stub = KnnService::NewStub(Connect());
  knnd::v1::GetIndexInfoResponse info;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status s = stub->GetIndexInfo(&context, {}, &info);
    if (!s.ok()) return FailRpc("GetIndexInfo", s);
  }
  knnd::Matrix queries;
  if (!absl::GetFlag(FLAGS_queries).empty()) {
    absl::StatusOr<knnd::Matrix> read =
        knnd::ReadVectors(absl::GetFlag(FLAGS_queries),
                          absl::GetFlag(FLAGS_limit));
    if (!read.ok()) return Fail(std::string(read.status().message()));
    queries = std::move(*read);
  } else if (absl::GetFlag(FLAGS_random) > 0) {
    queries.rows = absl::GetFlag(FLAGS_random);
    queries.dim = static_cast<int>(info.dim());
    queries.values.resize(static_cast<size_t>(queries.rows) * queries.dim);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (float& v : queries.values) v = normal(rng);
  } else {
    return Fail("search needs --queries FILE or --random N");
  }
  const int64_t batch = std::max<int64_t>(1, absl::GetFlag(FLAGS_batch));
  const int k = absl::GetFlag(FLAGS_k);
  std::vector<double> latencies_ms;
  const absl::Time start = absl::Now();
  int64_t shown = 0;
  for (int64_t begin = 0; begin < queries.rows; begin += batch) {
    const int64_t end = std::min(queries.rows, begin + batch);
    knnd::v1::SearchRequest request;
    request.set_dim(static_cast<uint32_t>(queries.dim));
    request.set_k(k);
    if (absl::GetFlag(FLAGS_refine_factor) >= 0) {
      request.set_refine_factor(
          static_cast<uint32_t>(absl::GetFlag(FLAGS_refine_factor)));
    }
    if (absl::GetFlag(FLAGS_nprobe) > 0) {
      request.set_nprobe(static_cast<uint32_t>(absl::GetFlag(FLAGS_nprobe)));
    }
    request.set_vectors_f32le(
        reinterpret_cast<const char*>(queries.row(begin)),
        static_cast<size_t>(end - begin) * queries.dim * sizeof(float));
    knnd::v1::SearchResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const absl::Time t0 = absl::Now();
    grpc::Status s = stub->Search(&context, request, &response);
    latencies_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!s.ok()) return FailRpc("Search", s);
    for (int64_t q = 0; q < end - begin && shown < absl::GetFlag(FLAGS_show);
         ++q, ++shown) {
      std::printf("query %lld:", static_cast<long long>(begin + q));
      for (int j = 0; j < response.k(); ++j) {
        const int idx = static_cast<int>(q * response.k() + j);
        std::printf(" %lld(%.4g)", static_cast<long long>(response.ids(idx)),
                    response.distances(idx));
      }
      std::printf("\n");
    }
    if (begin == 0) {
      std::printf("index version %lld, metric %s, nprobe %u, refine_factor "
                  "%u\n",
                  static_cast<long long>(response.index_version()),
                  MetricOf(response.metric()), response.nprobe(),
                  response.refine_factor());
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "%lld queries in %zu requests of <= %lld: %.1f ms total, %.0f queries/s; "
      "request latency p50 %.2f ms, p99 %.2f ms\n",
      static_cast<long long>(queries.rows), latencies_ms.size(),
      static_cast<long long>(batch), seconds * 1e3, queries.rows / seconds,
      Percentile(latencies_ms, 0.5), Percentile(latencies_ms, 0.99));
  return 0;
}

int Info() {
  if (!absl::GetFlag(FLAGS_index).empty()) {
    absl::StatusOr<std::unique_ptr<knnd::IndexSnapshot>> snapshot =
        knnd::IndexSnapshot::Load(absl::GetFlag(FLAGS_index), {});
    if (!snapshot.ok()) return Fail(std::string(snapshot.status().message()));
    const knnd::IndexInfo& i = (*snapshot)->info();
    std::printf(
        "path:            %s\ntype:            %s\nvectors:         %lld\n"
        "dim:             %d\nmetric:          %s\nnlist:           %lld\n"
        "pq:              M=%d x %d bits, %lld bytes/vector\n"
        "stored nprobe:   %d\nfile:            %.1f MiB (mapped lists %.1f MiB)\n"
        "heap:            %.1f MiB (precomputed table %.1f MiB)\n"
        "load:            %.1f ms\n",
        i.path.c_str(), i.index_type.c_str(), static_cast<long long>(i.ntotal),
        i.dim, knnd::MetricName(i.metric), static_cast<long long>(i.nlist),
        i.pq_m, i.pq_nbits, static_cast<long long>(i.code_size_bytes),
        i.stored_nprobe, i.file_bytes / 1048576.0,
        i.mapped_list_bytes / 1048576.0, i.heap_bytes / 1048576.0,
        i.precomputed_table_bytes / 1048576.0,
        absl::ToDoubleMilliseconds(i.load_duration));
    if (i.has_vectors) {
      std::printf("raw vectors:     %s (%s, %.1f MiB) for refine_factor > 0\n",
                  i.vectors_path.c_str(), i.vectors_dtype.c_str(),
                  i.vectors_file_bytes / 1048576.0);
    } else if (!i.vectors_error.empty()) {
      std::printf("raw vectors:     not usable: %s\n", i.vectors_error.c_str());
    }
    return 0;
  }
  auto stub = KnnService::NewStub(Connect());
  knnd::v1::GetIndexInfoResponse info;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status s = stub->GetIndexInfo(&context, {}, &info);
  if (!s.ok()) return FailRpc("GetIndexInfo", s);
  std::printf("%s", info.DebugString().c_str());
  return 0;
}

int Publish() {
  const std::string index = absl::GetFlag(FLAGS_index);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (index.empty() || dir.empty()) {
    return Fail("publish needs --index FILE and --dir DIR");
  }
  absl::StatusOr<knnd::IndexVersion> published =
      knnd::PublishVersion(dir, index);
  if (!published.ok()) return Fail(std::string(published.status().message()));
  std::printf("published: %s as version %lld (%s)\n", index.c_str(),
              static_cast<long long>(published->version),
              published->path.c_str());
  std::printf("next:      knnctl reload (admin API), kill -HUP $(pidof "
              "knnd), or set index_poll_interval_ms\n");
  return 0;
}

// Loads (or pins) a version through knnd's admin API and says what serves.
int Reload() {
  auto stub = knnd::v1::AdminService::NewStub(Connect(kAdminAddr));
  knnd::v1::ReloadIndexRequest request;
  if (auto pin = absl::GetFlag(FLAGS_pin)) request.set_version(*pin);
  knnd::v1::ReloadIndexResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status s = stub->ReloadIndex(&context, request, &response);
  if (!s.ok()) return FailRpc("reload", s);
  std::printf("serving:  version %lld (%s)\n",
              static_cast<long long>(response.version()),
              response.path().c_str());
  std::printf("before:   version %lld\n",
              static_cast<long long>(response.previous_version()));
  std::printf("loaded:   %s\n",
              response.loaded() ? "yes" : "no (already serving, or retained)");
  std::printf("pinned:   %s\n",
              response.pinned_version() == 0
                  ? "no (follows the latest version)"
                  : absl::StrCat("version ", response.pinned_version()).c_str());
  std::printf("took:     %.1f ms\n", response.duration_ms());
  return 0;
}

int Versions() {
  auto stub = knnd::v1::AdminService::NewStub(Connect(kAdminAddr));
  knnd::v1::ListVersionsResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status s =
      stub->ListVersions(&context, knnd::v1::ListVersionsRequest(), &response);
  if (!s.ok()) return FailRpc("versions", s);
  std::printf("%8s  %-8s  %s\n", "version", "state", "path");
  for (const knnd::v1::IndexVersionInfo& v : response.versions()) {
    std::string state = v.serving() ? "serving" : v.retained() ? "retained"
                                  : v.refused() ? "refused" : "-";
    std::printf("%8lld  %-8s  %s%s\n", static_cast<long long>(v.version()),
                state.c_str(), v.path().c_str(),
                v.refused() ? absl::StrCat("\n          ", v.refused_reason())
                                  .c_str()
                            : "");
  }
  std::printf("pinned:  %s\n",
              response.pinned_version() == 0
                  ? "no"
                  : absl::StrCat("version ", response.pinned_version()).c_str());
  return 0;
}

int Health() {
  auto stub = grpc::health::v1::Health::NewStub(Connect());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status s = stub->Check(&context, request, &response);
  if (!s.ok()) {
    FailRpc("health check", s);
    return 1;
  }
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                          response.status())
                          .c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? 0
             : 1;
}

// Reports progress of a long loop on stderr: a bar redrawn in place with
// rate and ETA when stderr is a terminal, otherwise a plain line about every
// 10% (logs and CI capture stay readable).
class Progress {
 public:
  Progress(std::string what, int64_t total)
      : what_(std::move(what)),
        total_(total),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(absl::Now()) {}

  void Update(int64_t done) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    const double rate = seconds > 0 ? done / seconds : 0;
    const double eta = rate > 0 ? (total_ - done) / rate : 0;
    const double fraction = total_ > 0 ? static_cast<double>(done) / total_ : 1;
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %lld/%lld %.0f rows/s ETA %.0fs ",
                   what_.c_str(), std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), 100 * fraction,
                   static_cast<long long>(done), static_cast<long long>(total_),
                   rate, eta);
      if (done >= total_) std::fprintf(stderr, "\n");
    } else if (done >= total_ || fraction >= next_line_) {
      std::fprintf(stderr, "%s %lld/%lld rows (%.0f%%), %.0f rows/s, ETA %.0fs\n",
                   what_.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total_), 100 * fraction, rate, eta);
      next_line_ = fraction + 0.1;
    }
    std::fflush(stderr);
  }

 private:
  const std::string what_;
  const int64_t total_;
  const bool tty_;
  const absl::Time start_;
  double next_line_ = 0.1;
};

double MiBOf(int64_t bytes) { return bytes / 1048576.0; }

// Ids for the rows of the input: one column, one per row, unique and >= 0
// (-1 marks a missing neighbour in results).
absl::StatusOr<std::vector<int64_t>> ReadRowIds(const std::string& path,
                                                int64_t rows) {
  absl::StatusOr<knnd::IdMatrix> ids = knnd::ReadIds(path);
  if (!ids.ok()) return ids.status();
  if (ids->cols != 1 || ids->rows != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds ", ids->rows, " x ", ids->cols, " ids; expected ", rows,
        " (one per input row)"));
  }
  std::vector<int64_t> sorted = ids->values;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": id ", sorted.front(), " is negative; ids must be >= 0"));
  }
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end());
      dup != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": id ", *dup, " appears more than once"));
  }
  return std::move(ids->values);
}

// `count` distinct row numbers out of `rows`, seeded, ascending (so the copy
// reads the input front to back).
std::vector<int64_t> SampleRows(int64_t rows, int64_t count, uint32_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) all[i] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, rows - 1);
    std::swap(all[i], all[pick(rng)]);
  }
  all.resize(static_cast<size_t>(count));
  std::sort(all.begin(), all.end());
  return all;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

// Writes `x` (L2-normalised for cosine, as the index holds them) to `path`
// in batches of `batch` rows.
absl::Status WriteRawVectors(const knnd::Matrix& x, knnd::Metric metric,
                             const std::string& path,
                             knnd::VectorsDtype dtype, int64_t batch) {
  absl::StatusOr<std::unique_ptr<knnd::VectorsFileWriter>> writer =
      knnd::VectorsFileWriter::Create(path, x.dim, dtype);
  if (!writer.ok()) return writer.status();
  std::vector<float> normalized;
  for (int64_t begin = 0; begin < x.rows; begin += batch) {
    const int64_t n = std::min(batch, x.rows - begin);
    const float* rows = x.row(begin);
    if (metric == knnd::Metric::kCosine) {
      normalized.assign(rows, rows + n * x.dim);
      for (int64_t i = 0; i < n; ++i) {
        float* v = normalized.data() + i * x.dim;
        double norm = 0;
        for (int j = 0; j < x.dim; ++j) norm += double{v[j]} * v[j];
        if (norm > 0) {
          const float scale = static_cast<float>(1.0 / std::sqrt(norm));
          for (int j = 0; j < x.dim; ++j) v[j] *= scale;
        }
      }
      rows = normalized.data();
    }
    if (absl::Status s = (*writer)->Append(rows, n); !s.ok()) return s;
  }
  return (*writer)->Finish();
}

int Build() {
  const std::string input = absl::GetFlag(FLAGS_input);
  const std::string output = absl::GetFlag(FLAGS_output);
  if (input.empty() || output.empty()) {
    return Fail("build needs --input FILE and --output INDEX");
  }
  absl::StatusOr<knnd::Metric> metric =
      knnd::ParseMetric(absl::GetFlag(FLAGS_metric));
  if (!metric.ok()) return Fail(std::string(metric.status().message()));
  std::string factory = absl::GetFlag(FLAGS_factory);
  if (!factory.empty() &&
      (absl::GetFlag(FLAGS_nlist) > 0 || absl::GetFlag(FLAGS_m) > 0)) {
    return Fail("give either --factory or --nlist/--m, not both");
  }
  const bool keep_vectors = absl::GetFlag(FLAGS_keep_vectors);
  absl::StatusOr<knnd::VectorsDtype> vectors_dtype =
      knnd::ParseVectorsDtype(absl::GetFlag(FLAGS_vectors_dtype));
  if (!vectors_dtype.ok()) {
    return Fail(absl::StrCat("--vectors_dtype: ",
                             vectors_dtype.status().message()));
  }
  if (keep_vectors && !absl::GetFlag(FLAGS_ids).empty()) {
    return Fail("--keep_vectors stores row i as the vector of id i, so it "
                "needs the sequential ids of a build without --ids");
  }
  // Fail before reading and training, not after.
  if (access(DirectoryOf(output).c_str(), W_OK) != 0) {
    return Fail(absl::StrCat("cannot write into the directory of ", output,
                             ": ", std::strerror(errno)));
  }

  const absl::Time read_start = absl::Now();
  absl::StatusOr<knnd::Matrix> read = knnd::ReadVectors(input);
  if (!read.ok()) return Fail(std::string(read.status().message()));
  const knnd::Matrix& x = *read;
  std::printf("input:    %s: %lld x %d float32 (%.1f MiB), read in %.1f s\n",
              input.c_str(), static_cast<long long>(x.rows), x.dim,
              MiBOf(static_cast<int64_t>(x.values.size() * sizeof(float))),
              absl::ToDoubleSeconds(absl::Now() - read_start));
  std::vector<int64_t> ids;
  if (!absl::GetFlag(FLAGS_ids).empty()) {
    absl::StatusOr<std::vector<int64_t>> read_ids =
        ReadRowIds(absl::GetFlag(FLAGS_ids), x.rows);
    if (!read_ids.ok()) return Fail(std::string(read_ids.status().message()));
    ids = std::move(*read_ids);
  }

  if (factory.empty()) {
    const int64_t nlist = absl::GetFlag(FLAGS_nlist) > 0
                              ? absl::GetFlag(FLAGS_nlist)
                              : knnd::DefaultNlist(x.rows);
    const int m = absl::GetFlag(FLAGS_m) > 0 ? absl::GetFlag(FLAGS_m)
                                             : knnd::DefaultPqM(x.dim);
    if (x.dim % m != 0) {
      return Fail(absl::StrCat("--m=", m, " does not divide dim=", x.dim));
    }
    factory = absl::StrCat("IVF", nlist, ",PQ", m);
    std::printf("factory:  %s (nlist %s, M %s: %d-dim sub-vectors, %d bytes "
                "per vector)\n",
                factory.c_str(),
                absl::GetFlag(FLAGS_nlist) > 0 ? "from --nlist"
                                               : "~4*sqrt(N), <= N/39",
                absl::GetFlag(FLAGS_m) > 0 ? "from --m"
                                           : "largest divisor of dim <= 64",
                x.dim / m, m);
  } else {
    std::printf("factory:  %s (from --factory)\n", factory.c_str());
  }
  knnd::IndexBuilder::Options options;
  options.dim = x.dim;
  options.metric = *metric;
  options.factory = factory;
  options.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<std::unique_ptr<knnd::IndexBuilder>> builder =
      knnd::IndexBuilder::Create(options);
  if (!builder.ok()) return Fail(std::string(builder.status().message()));
  knnd::IndexBuilder& b = **builder;

  int64_t train_rows = absl::GetFlag(FLAGS_train_size) > 0
                           ? absl::GetFlag(FLAGS_train_size)
                           : knnd::DefaultTrainRows(x.rows, b.nlist());
  if (train_rows > x.rows) {
    std::printf("note:     --train_size=%lld exceeds the %lld input rows; "
                "training on all of them\n",
                static_cast<long long>(train_rows),
                static_cast<long long>(x.rows));
    train_rows = x.rows;
  }
  std::printf("metric:   %s%s\n", knnd::MetricName(*metric),
              *metric == knnd::Metric::kCosine
                  ? " (vectors L2-normalised; knnd normalises queries)"
                  : "");
  std::printf("training: %lld rows (%s, seed %u), %.1f MiB\n",
              static_cast<long long>(train_rows),
              train_rows == x.rows ? "all rows" : "seeded random sample",
              absl::GetFlag(FLAGS_seed),
              MiBOf(train_rows * x.dim * static_cast<int64_t>(sizeof(float))));
  if (train_rows < 39 * b.nlist()) {
    std::printf("warning:  %lld training rows are fewer than 39 * nlist = "
                "%lld, the minimum FAISS's k-means wants; centroids will be "
                "poor. Lower --nlist or raise --train_size.\n",
                static_cast<long long>(train_rows),
                static_cast<long long>(39 * b.nlist()));
  }
  std::fflush(stdout);

  const absl::Time train_start = absl::Now();
  absl::Status trained;
  if (train_rows == x.rows) {
    trained = b.Train(x.values.data(), x.rows);
  } else {
    std::vector<float> sample(static_cast<size_t>(train_rows) * x.dim);
    const std::vector<int64_t> rows =
        SampleRows(x.rows, train_rows, absl::GetFlag(FLAGS_seed));
    for (int64_t i = 0; i < train_rows; ++i) {
      std::copy(x.row(rows[i]), x.row(rows[i]) + x.dim,
                sample.data() + i * x.dim);
    }
    trained = b.Train(sample.data(), train_rows);
  }
  if (!trained.ok()) return Fail(std::string(trained.message()));
  std::printf("trained in %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - train_start));
  std::fflush(stdout);

  const int64_t batch = std::max<int64_t>(1, absl::GetFlag(FLAGS_add_batch));
  Progress progress("adding", x.rows);
  for (int64_t begin = 0; begin < x.rows; begin += batch) {
    const int64_t n = std::min(batch, x.rows - begin);
    if (absl::Status s =
            b.Add(x.row(begin), n, ids.empty() ? nullptr : ids.data() + begin);
        !s.ok()) {
      return Fail(std::string(s.message()));
    }
    progress.Update(begin + n);
  }

  const int nprobe = absl::GetFlag(FLAGS_nprobe) > 0
                         ? absl::GetFlag(FLAGS_nprobe)
                         : knnd::DefaultNprobe(b.nlist());
  knnd::v1::IndexMetadata metadata;
  metadata.set_source(input);
  metadata.set_created(absl::FormatTime(absl::RFC3339_sec, absl::Now(),
                                        absl::UTCTimeZone()));
  metadata.set_train_rows(train_rows);
  metadata.set_built_by(absl::StrCat("knnctl build: ", knnd::BuildInfoLine()));
  // The vectors file goes in first; the index and then its sidecar follow,
  // and a loader takes a version as complete only with its sidecar.
  const std::string vectors_path = knnd::VectorsPath(output);
  if (keep_vectors) {
    if (absl::Status s = WriteRawVectors(x, *metric, vectors_path,
                                         *vectors_dtype, batch);
        !s.ok()) {
      return Fail(std::string(s.message()));
    }
  } else if (unlink(vectors_path.c_str()) == 0) {
    std::printf("removed:  %s (of a previous build; no --keep_vectors)\n",
                vectors_path.c_str());
  }
  if (absl::Status s = b.Write(output, nprobe, metadata); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  struct stat st;
  stat(output.c_str(), &st);
  std::printf("wrote:    %s (%lld vectors, %.1f MiB, stored nprobe %d) and "
              "%s\n",
              output.c_str(), static_cast<long long>(b.ntotal()),
              MiBOf(st.st_size), nprobe, knnd::MetadataPath(output).c_str());
  if (keep_vectors) {
    stat(vectors_path.c_str(), &st);
    std::printf("wrote:    %s (%s, %.1f MiB, for refine_factor > 0)\n",
                vectors_path.c_str(), knnd::VectorsDtypeName(*vectors_dtype),
                MiBOf(st.st_size));
  }
  std::printf("next:     knnctl eval --index %s --queries QUERIES --base %s\n",
              output.c_str(), input.c_str());
  return 0;
}

// The R values of the recall columns: 1, 10, 100 and --k, at most ntotal.
std::vector<int> RecallColumns(int k, int64_t ntotal) {
  std::vector<int> columns;
  for (int r : {1, 10, 100, k}) {
    if (r >= 1 && r <= ntotal) columns.push_back(r);
  }
  std::sort(columns.begin(), columns.end());
  columns.erase(std::unique(columns.begin(), columns.end()), columns.end());
  return columns;
}

absl::StatusOr<std::vector<int>> NprobeList(int64_t nlist) {
  std::vector<int> nprobes;
  const std::string list = absl::GetFlag(FLAGS_nprobes);
  if (list.empty()) {
    for (int64_t p = 1; p < nlist; p *= 2) nprobes.push_back(static_cast<int>(p));
    nprobes.push_back(static_cast<int>(nlist));
    return nprobes;
  }
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int p;
    if (!absl::SimpleAtoi(part, &p) || p < 1 || p > nlist) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nprobes: '", part, "' is not an nprobe in [1, nlist=", nlist,
          "]"));
    }
    nprobes.push_back(p);
  }
  return nprobes;
}

// --refine_factors, or 0,1,2,4,8,16 with vectors and 0 without.
absl::StatusOr<std::vector<int>> RefineFactorList(bool has_vectors) {
  const std::string list = absl::GetFlag(FLAGS_refine_factors);
  if (list.empty()) {
    if (!has_vectors) return std::vector<int>{0};
    return std::vector<int>{0, 1, 2, 4, 8, 16};
  }
  std::vector<int> factors;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int f;
    if (!absl::SimpleAtoi(part, &f) || f < 0 || f > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--refine_factors: '", part, "' is not a refine_factor in [0, 1024]"));
    }
    if (f > 0 && !has_vectors) {
      return absl::FailedPreconditionError(
          "--refine_factors > 0 needs INDEX.vectors (knnctl build "
          "--keep_vectors)");
    }
    factors.push_back(f);
  }
  return factors;
}

int Eval() {
  const std::string index_path = absl::GetFlag(FLAGS_index);
  const std::string queries_path = absl::GetFlag(FLAGS_queries);
  const std::string truth_path = absl::GetFlag(FLAGS_ground_truth);
  const std::string base_path = absl::GetFlag(FLAGS_base);
  if (index_path.empty() || queries_path.empty() ||
      (truth_path.empty() == base_path.empty())) {
    return Fail("eval needs --index INDEX --queries FILE and either "
                "--ground_truth FILE or --base FILE (exact search over the "
                "indexed vectors)");
  }
  absl::StatusOr<std::unique_ptr<knnd::IndexSnapshot>> snapshot =
      knnd::IndexSnapshot::Load(index_path, {});
  if (!snapshot.ok()) return Fail(std::string(snapshot.status().message()));
  const knnd::IndexInfo& info = (*snapshot)->info();
  absl::StatusOr<knnd::Matrix> queries =
      knnd::ReadVectors(queries_path, absl::GetFlag(FLAGS_limit));
  if (!queries.ok()) return Fail(std::string(queries.status().message()));
  const int k = absl::GetFlag(FLAGS_k);
  if (k < 1 || k > info.ntotal) {
    return Fail(absl::StrCat("--k=", k, " must be in [1, ntotal=", info.ntotal,
                             "]"));
  }
  std::vector<int> columns = RecallColumns(k, info.ntotal);
  absl::StatusOr<std::vector<int>> nprobes = NprobeList(info.nlist);
  if (!nprobes.ok()) return Fail(std::string(nprobes.status().message()));
  std::printf("index:    %s: %s, %lld vectors x %d, metric %s\n",
              index_path.c_str(), info.index_type.c_str(),
              static_cast<long long>(info.ntotal), info.dim,
              knnd::MetricName(info.metric));
  std::printf("queries:  %s: %lld\n", queries_path.c_str(),
              static_cast<long long>(queries->rows));

  std::vector<int64_t> truth;
  int truth_k = 0;
  if (!truth_path.empty()) {
    absl::StatusOr<knnd::IdMatrix> read = knnd::ReadIds(truth_path);
    if (!read.ok()) return Fail(std::string(read.status().message()));
    if (read->rows < queries->rows) {
      return Fail(absl::StrCat(truth_path, " has ", read->rows,
                               " rows for ", queries->rows, " queries"));
    }
    truth_k = read->cols;
    truth.assign(read->values.begin(),
                 read->values.begin() + queries->rows * truth_k);
    columns.erase(std::remove_if(columns.begin(), columns.end(),
                                 [&](int r) { return r > truth_k; }),
                  columns.end());
    if (columns.empty() || k > truth_k) {
      return Fail(absl::StrCat(truth_path, " has ", truth_k,
                               " neighbours per query, fewer than --k=", k));
    }
    std::printf("truth:    %s: %d neighbours per query\n", truth_path.c_str(),
                truth_k);
  } else {
    absl::StatusOr<knnd::Matrix> base = knnd::ReadVectors(base_path);
    if (!base.ok()) return Fail(std::string(base.status().message()));
    if (base->rows != info.ntotal) {
      return Fail(absl::StrCat(base_path, " has ", base->rows,
                               " rows but the index holds ", info.ntotal,
                               "; --base must be the indexed vectors"));
    }
    truth_k = columns.back();
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<int64_t>> exact =
        knnd::ExactNeighbors(*base, *queries, truth_k, info.metric);
    if (!exact.ok()) return Fail(std::string(exact.status().message()));
    truth = std::move(*exact);
    if (!absl::GetFlag(FLAGS_ids).empty()) {
      absl::StatusOr<std::vector<int64_t>> ids =
          ReadRowIds(absl::GetFlag(FLAGS_ids), base->rows);
      if (!ids.ok()) return Fail(std::string(ids.status().message()));
      for (int64_t& id : truth) id = (*ids)[id];
    }
    std::printf("truth:    exact %s search over %s (%lld rows), %.1f s\n",
                knnd::MetricName(info.metric), base_path.c_str(),
                static_cast<long long>(base->rows),
                absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::fflush(stdout);

  absl::StatusOr<std::vector<int>> refine_factors =
      RefineFactorList(info.has_vectors);
  if (!refine_factors.ok()) {
    return Fail(std::string(refine_factors.status().message()));
  }
  if (info.has_vectors) {
    std::printf("vectors:  %s (%s): exact re-ranking available\n",
                info.vectors_path.c_str(), info.vectors_dtype.c_str());
  } else if (!info.vectors_error.empty()) {
    std::printf("vectors:  not used: %s\n", info.vectors_error.c_str());
  }

  std::printf("\n%8s  %6s", "nprobe", "refine");
  for (int r : columns) std::printf("  %10s", absl::StrCat("recall@", r).c_str());
  std::printf("  %10s\n", "queries/s");
  // One (nprobe, refine_factor) at a time, so each row shows as soon as it
  // is measured.
  knnd::SweepOptions sweep;
  sweep.recall_at = columns;
  sweep.batch_rows = absl::GetFlag(FLAGS_batch);
  std::vector<knnd::SweepRow> rows;
  for (int refine_factor : *refine_factors) {
    for (int nprobe : *nprobes) {
      sweep.nprobes = {nprobe};
      sweep.refine_factor = refine_factor;
      absl::StatusOr<std::vector<knnd::SweepRow>> row =
          knnd::SweepNprobe(**snapshot, *queries, truth, truth_k, sweep);
      if (!row.ok()) return Fail(std::string(row.status().message()));
      std::printf("%8d  %6d", row->front().nprobe, refine_factor);
      for (double recall : row->front().recall) {
        std::printf("  %10.4f", recall);
      }
      std::printf("  %10.0f\n", row->front().queries_per_second);
      std::fflush(stdout);
      rows.push_back(std::move(row->front()));
    }
  }
  const size_t target_column =
      std::find(columns.begin(), columns.end(), k) - columns.begin();
  const double target = absl::GetFlag(FLAGS_target_recall);
  // Among the settings reaching the target, the fastest measured one.
  const knnd::SweepRow* reached = nullptr;
  const knnd::SweepRow* best = &rows.front();
  for (const knnd::SweepRow& row : rows) {
    if (row.recall[target_column] >= target &&
        (reached == nullptr ||
         row.queries_per_second > reached->queries_per_second)) {
      reached = &row;
    }
    if (row.recall[target_column] > best->recall[target_column]) best = &row;
  }
  std::printf("\n");
  const knnd::SweepRow* chosen = reached;
  if (reached != nullptr) {
    std::printf("recall@%d >= %.3g: fastest at nprobe %d refine_factor %d "
                "(%.4f, %.0f queries/s)\n",
                k, target, reached->nprobe, reached->refine_factor,
                reached->recall[target_column], reached->queries_per_second);
  } else {
    // More nprobe cannot fix what the PQ codes lost; take the fastest
    // setting within 0.005 of the best recall instead.
    for (const knnd::SweepRow& row : rows) {
      if (row.recall[target_column] >= best->recall[target_column] - 0.005 &&
          (chosen == nullptr ||
           row.queries_per_second > chosen->queries_per_second)) {
        chosen = &row;
      }
    }
    std::printf(
        "no setting reaches recall@%d >= %.3g: the best is %.4f at nprobe %d "
        "refine_factor %d. The PQ codes limit recall: %s\n",
        k, target, best->recall[target_column], best->nprobe,
        best->refine_factor,
        info.has_vectors
            ? "try larger --refine_factors or rebuild with a larger --m."
            : "rebuild with a larger --m (more bytes per vector), or with "
              "--keep_vectors and re-rank candidates exactly "
              "(--refine_factors).");
  }
  std::printf("chosen nprobe: %d refine_factor: %d (recall@%d %.4f); serve "
              "it with default_nprobe: %d and default_refine_factor: %d in "
              "the config, or per request\n",
              chosen->nprobe, chosen->refine_factor, k,
              chosen->recall[target_column], chosen->nprobe,
              chosen->refine_factor);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  knnd::RunIndexProbeIfAsked(argc, argv);
  const std::map<std::string, std::function<int()>> commands = {
      {"build", Build}, {"eval", Eval},     {"search", Search},
      {"info", Info},   {"health", Health}, {"publish", Publish},
      {"reload", Reload}, {"versions", Versions}};
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return knnd::BuildInfoLine() + "\n"; };
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "src/tools/knnctl.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "the command-line companion of knnd.\n"
      "  knnctl build --input FILE --output INDEX [--metric l2|ip|cosine] "
      "[--factory STR | --nlist N --m M] [--train_size N] [--ids FILE]\n"
      "  knnctl eval --index INDEX --queries FILE (--ground_truth FILE | "
      "--base FILE) [--k 10] [--target_recall 0.95]\n"
      "  knnctl search --addr HOST:PORT (--queries FILE | --random N) "
      "[--k 10] [--nprobe P]\n"
      "  knnctl info (--addr HOST:PORT | --index FILE)\n"
      "  knnctl health --addr HOST:PORT\n"
      "  knnctl publish --index FILE --dir DIR\n"
      "  knnctl reload [--addr HOST:ADMIN_PORT] [--pin N]\n"
      "  knnctl versions [--addr HOST:ADMIN_PORT]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  // OpenBLAS threads spinning next to FAISS's OpenMP threads oversubscribe
  // the cores (shared/DESIGN.md); FAISS parallelises over rows itself.
  knnd::UseSingleThreadedBlas();
  if (absl::GetFlag(FLAGS_threads) > 0) {
    knnd::SetOpenMpThreadsOfThisThread(absl::GetFlag(FLAGS_threads));
  }
  if (args.size() != 2 || commands.count(args[1]) == 0) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  return commands.at(args[1])();
}
