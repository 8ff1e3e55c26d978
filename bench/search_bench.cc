// search_bench: knnd over loopback gRPC against in-process FAISS on the same
// index, in one run, so that the ratios hold on a shared, noisy machine.
//
//   build/search_bench [--n 200000] [--d 128] [--factory IVF1024,PQ32]
//                      [--nprobe 16] [--seconds 2] [--index FILE]
//
// Cases (all at the same nprobe and k=10):
//   faiss-heap   faiss::read_index (lists on the heap), one thread, the ceiling
//   faiss-mmap   knnd's IndexSnapshot (lists memory-mapped), one thread
//   knnd-grpc    a knnd server in this process, C clients over 127.0.0.1,
//                for batch sizes 1, 8, 32, 256 and 1..64 concurrent clients
//   batching     knnd with request coalescing off vs on (one server per
//                --queue_delays_us value) at --batching_clients concurrent
//                single-query clients
// --cases picks which run (comma-separated: inprocess, grpc, batching).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <atomic>
#include <cstdio>
#include <vector>

#include <faiss/IVFlib.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <grpcpp/grpcpp.h>
#include <omp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench_threads.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/index/index_probe.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/server.h"
#include "knnd/v1/knn_service.grpc.pb.h"
#include "knnd/base/percentile.h"

ABSL_FLAG(int64_t, n, 200000, "Vectors in the synthetic index.");
ABSL_FLAG(int, d, 128, "Dimension.");
ABSL_FLAG(std::string, factory, "IVF1024,PQ32", "FAISS factory string.");
ABSL_FLAG(int, nprobe, 16, "nprobe for every case.");
ABSL_FLAG(double, seconds, 2.0, "Duration of each measurement.");
ABSL_FLAG(std::string, index, "/tmp/knnd_bench.index",
          "Index file; built from seeded data when absent.");
ABSL_FLAG(std::string, concurrency, "1,4,16,64", "Client counts.");
ABSL_FLAG(std::string, batches, "1,8,32,256", "Queries per request.");
ABSL_FLAG(std::string, cases, "inprocess,grpc,batching", "Cases to run.");
ABSL_FLAG(int, batching_clients, 32, "Single-query clients, batching case.");
ABSL_FLAG(std::string, queue_delays_us, "0,200,500,1000",
          "max_queue_delay_us values of the batching case (coalescing on).");
ABSL_FLAG(std::string, queries, "",
          "Raw float32 query rows (--d values each); default: 4096 seeded "
          "rows (seed 2).");
ABSL_FLAG(int, idle_us, 0,
          "Microseconds each thread rests after each call, outside the "
          "timed part: a server's gap between two requests at low load.");
ABSL_FLAG(bool, idle_spin, false,
          "Rest by spinning instead of sleeping (keeps the core awake, so a "
          "difference between the two is the core's idle state, not the "
          "gap itself).");
ABSL_FLAG(std::string, threads, "1",
          "In-process case: thread counts; each thread runs its own search "
          "loop with one OpenMP thread (2 = both cores of this machine).");

namespace {

using knnd::Percentile;

constexpr int kK = 10;

// Clustered seeded data, the shape real embeddings have.
std::vector<float> MakeData(int64_t n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int clusters = 256;
  std::vector<float> centres(static_cast<size_t>(clusters) * d);
  for (float& v : centres) v = 3.0f * normal(rng);
  std::uniform_int_distribution<int> pick(0, clusters - 1);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int64_t i = 0; i < n; ++i) {
    const float* c = centres.data() + static_cast<size_t>(pick(rng)) * d;
    for (int j = 0; j < d; ++j) x[i * d + j] = c[j] + normal(rng);
  }
  return x;
}

void BuildIfAbsent(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return;
  }
  const int64_t n = absl::GetFlag(FLAGS_n);
  const int d = absl::GetFlag(FLAGS_d);
  std::fprintf(stderr, "building %s over %lld x %d (seed 1) ...\n",
               absl::GetFlag(FLAGS_factory).c_str(), static_cast<long long>(n), d);
  std::vector<float> x = MakeData(n, d, 1);
  std::unique_ptr<faiss::Index> index(
      faiss::index_factory(d, absl::GetFlag(FLAGS_factory).c_str()));
  if (auto* pq = dynamic_cast<faiss::IndexIVFPQ*>(
          faiss::ivflib::extract_index_ivf(index.get()))) {
    pq->do_polysemous_training = false;
  }
  const int64_t train = std::min<int64_t>(n, 100000);
  index->train(train, x.data());
  index->add(n, x.data());
  const std::string tmp = path + ".tmp";
  faiss::write_index(index.get(), tmp.c_str());
  std::rename(tmp.c_str(), path.c_str());
}

struct Measured {
  double qps = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

// Runs `call(thread, iteration)` (returning queries done) on `threads`
// threads for the configured duration.
template <typename Call>
Measured Run(int threads, Call call) {
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const absl::Duration idle = absl::Microseconds(absl::GetFlag(FLAGS_idle_us));
  const bool spin = absl::GetFlag(FLAGS_idle_spin);
  std::vector<std::vector<double>> latencies(threads);
  std::atomic<int64_t> queries{0};
  const absl::Time start = absl::Now();
  knnd_bench::RunOnThreads(threads, [&](int t) {
    for (int64_t i = 0; absl::Now() - start < duration; ++i) {
      const absl::Time t0 = absl::Now();
      queries += call(t, i);
      const absl::Time t1 = absl::Now();
      latencies[t].push_back(absl::ToDoubleMilliseconds(t1 - t0));
      if (idle <= absl::ZeroDuration()) continue;
      if (spin) {
        while (absl::Now() - t1 < idle) {
        }
      } else {
        absl::SleepFor(idle);
      }
    }
  });
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  return {static_cast<double>(queries) / seconds, Percentile(all, 0.5),
          Percentile(all, 0.99)};
}

// A knnd server in this process, serving `path` on a free loopback port.
std::unique_ptr<knnd::Server> StartServer(const std::string& path, int nprobe,
                                          bool coalesce, int delay_us) {
  knnd::v1::ServerConfig config;
  config.set_index_path(path);
  config.set_listen_address("127.0.0.1:0");
  config.set_enable_reflection(false);
  config.set_default_nprobe(nprobe);
  config.set_slow_request_ms(0);  // the queue is meant to fill here
  config.set_metrics_listen_address("127.0.0.1:0");
  config.set_coalesce_requests(coalesce);
  config.set_max_queue_delay_us(delay_us);
  auto server = knnd::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok() || !(*server)->LoadIndex().ok()) {
    std::fprintf(stderr, "cannot start knnd\n");
    std::exit(1);
  }
  return std::move(*server);
}

// `clients` closed-loop clients, each on its own connection, sending
// requests of `batch` queries for the configured duration.
Measured RunClients(const std::string& address, const std::vector<float>& queries,
                    int d, int64_t pool_rows, int clients, int batch,
                    int64_t* rejected_out) {
  std::vector<std::unique_ptr<knnd::v1::KnnService::Stub>> stubs;
  for (int c = 0; c < clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // one connection per client
    stubs.push_back(knnd::v1::KnnService::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args)));
  }
  std::atomic<int64_t> rejected{0};
  Measured g = Run(clients, [&](int t, int64_t i) -> int64_t {
    knnd::v1::SearchRequest request;
    request.set_k(kK);
    const int64_t row = ((i * clients + t) * batch) % (pool_rows - batch);
    request.set_vectors_f32le(
        reinterpret_cast<const char*>(queries.data() + row * d),
        static_cast<size_t>(batch) * d * sizeof(float));
    knnd::v1::SearchResponse response;
    grpc::ClientContext context;
    if (!stubs[t]->Search(&context, request, &response).ok()) {
      ++rejected;
      return 0;
    }
    return batch;
  });
  *rejected_out = rejected.load();
  return g;
}

bool CaseOn(const std::string& name) {
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_cases), ',')) {
    if (c == name) return true;
  }
  return false;
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// No shutdown delay (nothing balances over the bench's server), 5 s for
// the searches in flight.
knnd::Server::DrainPlan FiveSecondDrain() {
  knnd::Server::DrainPlan plan;
  plan.grace = absl::Seconds(5);
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  knnd::UseBlasKernelsForThisCpu();  // as knnd and knnctl do, first thing
  knnd::UseSingleThreadedBlas();  // as knnd's workers: one thread a call
  knnd::RunIndexProbeIfAsked(argc, argv);
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(1);
  const std::string path = absl::GetFlag(FLAGS_index);
  BuildIfAbsent(path);
  const int nprobe = absl::GetFlag(FLAGS_nprobe);
  const int d = absl::GetFlag(FLAGS_d);
  std::vector<float> queries;
  if (absl::GetFlag(FLAGS_queries).empty()) {
    queries = MakeData(4096, d, 2);
  } else {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_queries).c_str(), "rb");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot open --queries\n");
      return 1;
    }
    float buf[4096];
    size_t got;
    while ((got = std::fread(buf, sizeof(float), 4096, f)) > 0) {
      queries.insert(queries.end(), buf, buf + got);
    }
    std::fclose(f);
  }
  const int64_t pool_rows = static_cast<int64_t>(queries.size()) / d;

  std::printf("# search_bench  %s\n", knnd::BuildInfoLine().c_str());
  std::printf("# index %s, nprobe %d, k %d, %.1f s per case\n", path.c_str(),
              nprobe, kK, absl::GetFlag(FLAGS_seconds));

  // In-process baselines, one thread (one core), for each batch size.
  std::unique_ptr<faiss::Index> heap(faiss::read_index(path.c_str()));
  faiss::SearchParametersIVF params;
  params.nprobe = nprobe;
  auto snapshot = knnd::IndexSnapshot::Load(path, {});
  if (!snapshot.ok()) {
    std::fprintf(stderr, "%s\n", snapshot.status().ToString().c_str());
    return 1;
  }
  std::map<int, double> heap_qps;
  if (CaseOn("inprocess")) {
    std::printf("\n## in-process (OpenMP 1 thread per loop)\n"
                "| batch | threads | faiss-heap q/s | heap p50 ms | faiss-mmap q/s "
                "| mmap p50 ms | mmap/heap |\n|---|---|---|---|---|---|---|\n");
    for (int threads : ParseList(absl::GetFlag(FLAGS_threads))) {
      for (int batch : ParseList(absl::GetFlag(FLAGS_batches))) {
        std::vector<std::vector<float>> D(threads, std::vector<float>(batch * kK));
        std::vector<std::vector<int64_t>> I(threads, std::vector<int64_t>(batch * kK));
        auto offset = [&](int t, int64_t i) {
          return (((i * threads + t) * batch) % (pool_rows - batch)) * d;
        };
        Measured h = Run(threads, [&](int t, int64_t i) {
          heap->search(batch, queries.data() + offset(t, i), kK, D[t].data(),
                       I[t].data(), &params);
          return batch;
        });
        Measured m = Run(threads, [&](int t, int64_t i) {
          knnd::SearchArgs args{queries.data() + offset(t, i), batch, kK, nprobe, {},
                                D[t].data(), I[t].data()};
          (void)(*snapshot)->Search(args);
          return batch;
        });
        if (threads == 1) heap_qps[batch] = h.qps;
        std::printf("| %d | %d | %.0f | %.3f | %.0f | %.3f | %.2f |\n", batch, threads,
                    h.qps, h.p50_ms, m.qps, m.p50_ms, m.qps / h.qps);
        std::fflush(stdout);
      }
    }
  }

  // knnd over loopback gRPC (default batching settings).
  if (CaseOn("grpc")) {
    auto server = StartServer(path, nprobe, true,
                              knnd::v1::ServerConfig().max_queue_delay_us());
    const std::string address = absl::StrCat("127.0.0.1:", server->port());
    std::printf("\n## knnd over loopback gRPC (%d workers), vs faiss-heap 1 thread\n"
                "| batch | clients | q/s | p50 ms | p99 ms | rejected | q/s vs faiss-heap |\n"
                "|---|---|---|---|---|---|---|\n",
                server->num_workers());
    for (int batch : ParseList(absl::GetFlag(FLAGS_batches))) {
      for (int clients : ParseList(absl::GetFlag(FLAGS_concurrency))) {
        int64_t rejected = 0;
        Measured g = RunClients(address, queries, d, pool_rows, clients, batch,
                                &rejected);
        std::printf("| %d | %d | %.0f | %.2f | %.2f | %lld | %.2f |\n", batch,
                    clients, g.qps, g.p50_ms, g.p99_ms,
                    static_cast<long long>(rejected),
                    heap_qps.count(batch) ? g.qps / heap_qps[batch] : 0.0);
        std::fflush(stdout);
      }
    }
    server->Drain(FiveSecondDrain());
  }

  // Dynamic batching off vs on, single-query clients, one server per setting.
  if (CaseOn("batching")) {
    const int clients = absl::GetFlag(FLAGS_batching_clients);
    std::printf("\n## batching: %d concurrent single-query clients\n"
                "| coalescing | max_queue_delay_us | q/s | p50 ms | p99 ms | rejected | q/s vs off |\n"
                "|---|---|---|---|---|---|---|\n", clients);
    double off_qps = 0;
    std::vector<std::pair<bool, int>> settings = {{false, 0}};
    for (int delay : ParseList(absl::GetFlag(FLAGS_queue_delays_us))) {
      settings.push_back({true, delay});
    }
    for (const auto& [coalesce, delay] : settings) {
      auto server = StartServer(path, nprobe, coalesce, delay);
      const std::string address = absl::StrCat("127.0.0.1:", server->port());
      int64_t rejected = 0;
      Measured g = RunClients(address, queries, d, pool_rows, clients, 1,
                              &rejected);
      if (!coalesce) off_qps = g.qps;
      std::printf("| %s | %d | %.0f | %.2f | %.2f | %lld | %.2f |\n",
                  coalesce ? "on" : "off", delay, g.qps, g.p50_ms, g.p99_ms,
                  static_cast<long long>(rejected), g.qps / off_qps);
      std::fflush(stdout);
      server->Drain(FiveSecondDrain());
    }
  }
  return 0;
}
