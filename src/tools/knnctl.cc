// knnctl: the command-line companion of knnd.
//   knnctl search --addr HOST:PORT (--queries FILE | --random N) [--k 10]
//                 [--nprobe P] [--batch N] [--show N]
//   knnctl info   (--addr HOST:PORT | --index FILE)
//   knnctl health --addr HOST:PORT      exit 0 when SERVING, 1 otherwise
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/build_info.h"
#include "knnd/index_snapshot.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd/vector_io.h"

ABSL_FLAG(std::string, addr, "localhost:50051", "knnd address, HOST:PORT.");
ABSL_FLAG(std::string, queries, "",
          "Query vectors: .npy, .fvecs, .bvecs or IDX (.gz allowed).");
ABSL_FLAG(int64_t, random, 0, "Send N seeded random queries instead.");
ABSL_FLAG(int64_t, limit, 0, "Use at most N rows of --queries; 0 = all.");
ABSL_FLAG(int, k, 10, "Neighbours per query.");
ABSL_FLAG(int, nprobe, 0, "Lists to visit; 0 = the server's default.");
ABSL_FLAG(int64_t, batch, 256, "Queries per request.");
ABSL_FLAG(int64_t, show, 3, "Print the neighbours of the first N queries.");
ABSL_FLAG(int, timeout_ms, 10000, "Deadline of each call, in ms.");
ABSL_FLAG(std::string, index, "", "Index file (info: read it locally).");
ABSL_FLAG(std::string, service, "", "health: service name to check.");

namespace {

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

std::shared_ptr<grpc::Channel> Connect() {
  return grpc::CreateChannel(absl::GetFlag(FLAGS_addr),
                             grpc::InsecureChannelCredentials());
}

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
}

const char* MetricOf(knnd::v1::Metric metric) {
  return metric == knnd::v1::METRIC_L2 ? "l2" : "inner_product";
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t i = static_cast<size_t>(p * (values.size() - 1) + 0.5);
  return values[std::min(i, values.size() - 1)];
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
      std::printf("index version %lld, metric %s, nprobe %u\n",
                  static_cast<long long>(response.index_version()),
                  MetricOf(response.metric()), response.nprobe());
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

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<int()>> commands = {
      {"search", Search}, {"info", Info}, {"health", Health}};
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return knnd::BuildInfoLine() + "\n"; };
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "src/tools/knnctl.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "the command-line companion of knnd.\n"
      "  knnctl search --addr HOST:PORT (--queries FILE | --random N) "
      "[--k 10] [--nprobe P]\n"
      "  knnctl info (--addr HOST:PORT | --index FILE)\n"
      "  knnctl health --addr HOST:PORT");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || commands.count(args[1]) == 0) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  return commands.at(args[1])();
}
