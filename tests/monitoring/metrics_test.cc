// knnd's /metrics as Prometheus sees it: scraped over HTTP from an
// in-process server after real traffic, replaced index series, a port in
// use; and against the real Prometheus tools from the Debian package
// `prometheus`: `promtool check metrics` on a live scrape, and a Prometheus
// server scraping an in-process knnd, read back through its query API.
// Without the package (make deps installs it) those two are skipped with a
// message saying so.
#include "knnd/monitoring/metrics.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/serving/serving_load.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CallSearch;
using ::knnd::testing::FindSample;
using ::knnd::testing::FreePort;
using ::knnd::testing::HttpGet;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::MakeSearchRequest;
using ::knnd::testing::RunCommand;
using ::knnd::testing::RunningServer;
using ::knnd::testing::Sample;
using ::knnd::testing::Scrape;
using ::knnd::testing::StartServer;
using ::knnd::testing::SumSamples;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::UrlEncode;
using ::knnd::testing::WriteIndex;

grpc::Status Search(RunningServer& s, int num_queries, int k) {
  return CallSearch(*s.stub,
                    MakeSearchRequest(MakeData(num_queries, 32, 7), k));
}

TEST(Metrics, ScrapeCountsTrafficByCodeReasonAndSize) {
  TempDir tmp;
  const std::string index = tmp.path("m.index");
  WriteIndex(index, IndexSpec{});
  knnd::v1::ServerConfig config = TestConfig(index);
  config.set_metrics_listen_address("127.0.0.1:0");
  config.set_max_batch_rows(64);
  config.set_max_inflight_queries(4096);
  config.set_max_queries_per_request(4096);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  const int port = s.server->metrics_port();
  ASSERT_GT(port, 0);

  // 3 x 1 query (1 unit each) + 2 x 100 queries (units of 64 + 36).
  for (int nq : {1, 1, 1, 100, 100}) {
    grpc::Status status = Search(s, nq, 5);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(Search(s, 1, 100000).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    ASSERT_TRUE(s.stub->GetIndexInfo(&context, {}, &info).ok());
  }
  // Fill the gate so that the next search is refused as queue_full.
  ASSERT_TRUE(s.server->gate().WaitUntilIdle(absl::Now() + absl::Seconds(10)));
  absl::StatusOr<AdmissionGate::Ticket> held =
      s.server->gate().TryAdmit(4096, 0);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(Search(s, 1, 5).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  const std::vector<Sample> m = Scrape(port);
  const std::map<std::string, std::string> search = {
      {"grpc_service", "knnd.v1.KnnService"},
      {"grpc_method", "Search"},
      {"grpc_type", "unary"},
      {"protocol", "grpc"}};
  auto with = [](std::map<std::string, std::string> labels, const char* k,
                 const char* v) {
    labels[k] = v;
    return labels;
  };
  EXPECT_EQ(FindSample(m, "grpc_server_handled_total",
                       with(search, "grpc_code", "OK")),
            5);
  EXPECT_EQ(FindSample(m, "grpc_server_handled_total",
                       with(search, "grpc_code", "INVALID_ARGUMENT")),
            1);
  EXPECT_EQ(FindSample(m, "grpc_server_handled_total",
                       with(search, "grpc_code", "RESOURCE_EXHAUSTED")),
            1);
  // Every code exists from the start, at 0 until it happens.
  EXPECT_EQ(FindSample(m, "grpc_server_handled_total",
                       with(search, "grpc_code", "UNAUTHENTICATED")),
            0);
  EXPECT_EQ(SumSamples(m, "grpc_server_handled_total", search), 7);
  EXPECT_EQ(FindSample(m, "grpc_server_handled_total",
                       {{"grpc_method", "GetIndexInfo"},
                        {"grpc_code", "OK"},
                        {"protocol", "grpc"}}),
            1);
  // The same series for HTTP/JSON calls, at 0 without any.
  EXPECT_EQ(SumSamples(m, "grpc_server_handled_total",
                       with(search, "protocol", "http")),
            0);
  EXPECT_EQ(FindSample(m, "grpc_server_handling_seconds_count", search), 7);
  EXPECT_EQ(FindSample(m, "grpc_server_handling_seconds_bucket",
                       with(search, "le", "+Inf")),
            7);

  EXPECT_EQ(FindSample(m, "knnd_search_rejected_total", {{"reason", "invalid"}}),
            1);
  EXPECT_EQ(
      FindSample(m, "knnd_search_rejected_total", {{"reason", "queue_full"}}),
      1);
  EXPECT_EQ(
      FindSample(m, "knnd_search_rejected_total", {{"reason", "memory_budget"}}),
      0);
  EXPECT_EQ(SumSamples(m, "knnd_search_rejected_total"), 2);

  EXPECT_EQ(FindSample(m, "knnd_search_request_queries_count"), 5);
  EXPECT_EQ(FindSample(m, "knnd_search_request_queries_sum"), 203);
  EXPECT_EQ(FindSample(m, "knnd_search_batch_rows_count"), 7);
  EXPECT_EQ(FindSample(m, "knnd_search_batch_rows_sum"), 203);
  EXPECT_EQ(FindSample(m, "knnd_search_batch_rows_bucket", {{"le", "32"}}), 3);
  EXPECT_EQ(FindSample(m, "knnd_search_batch_rows_bucket", {{"le", "64"}}), 7);
  EXPECT_EQ(FindSample(m, "knnd_search_queue_duration_seconds_count"), 5);
  EXPECT_EQ(FindSample(m, "knnd_search_execution_duration_seconds_count"), 5);
  EXPECT_EQ(FindSample(m, "knnd_queries_in_flight"), 4096);
  EXPECT_EQ(FindSample(m, "knnd_work_units_queued"), 0);

  // The index.
  const double file_bytes =
      static_cast<double>(std::filesystem::file_size(index));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double mapped_bytes = std::ceil(file_bytes / page) * page;
  EXPECT_EQ(FindSample(m, "knnd_index_info",
                       {{"version", "1"}, {"metric", "l2"},
                        {"factory", "IVF32,PQ8"}}),
            1);
  EXPECT_EQ(FindSample(m, "knnd_index_vectors"), 5000);
  EXPECT_EQ(FindSample(m, "knnd_index_dimensions"), 32);
  EXPECT_EQ(FindSample(m, "knnd_index_nlist"), 32);
  EXPECT_EQ(FindSample(m, "knnd_index_code_size_bytes"), 8);
  EXPECT_EQ(FindSample(m, "knnd_index_file_size_bytes"), file_bytes);
  EXPECT_GT(FindSample(m, "knnd_index_heap_bytes").value_or(0), 0);
  EXPECT_TRUE(FindSample(m, "knnd_index_precomputed_table_bytes").has_value());
  EXPECT_EQ(FindSample(m, "knnd_index_mapped_bytes"), mapped_bytes);
  const double resident =
      FindSample(m, "knnd_index_page_cache_resident_bytes").value_or(-1);
  EXPECT_GT(resident, 0);  // just written and searched
  EXPECT_LE(resident, mapped_bytes);
  EXPECT_EQ(FindSample(m, "knnd_build_info",
                       {{"version", GetBuildInfo().version},
                        {"git", GetBuildInfo().git_commit},
                        {"blas_kernels", GetBuildInfo().blas_kernels}}),
            1);

  // The process: the anonymous / file / shmem split adds up to the RSS.
  const double rss = FindSample(m, "process_resident_memory_bytes").value_or(0);
  EXPECT_GT(rss, 0);
  EXPECT_GT(FindSample(m, "knnd_process_resident_memory_bytes",
                       {{"type", "anonymous"}})
                .value_or(0),
            0);
  EXPECT_GT(
      FindSample(m, "knnd_process_resident_memory_bytes", {{"type", "file"}})
          .value_or(0),
      0);
  EXPECT_NEAR(SumSamples(m, "knnd_process_resident_memory_bytes"), rss,
              0.05 * rss);
  EXPECT_GT(FindSample(m, "process_virtual_memory_bytes").value_or(0), rss);
  EXPECT_GT(FindSample(m, "process_open_fds").value_or(0), 0);
  EXPECT_GT(FindSample(m, "process_start_time_seconds").value_or(0), 1.6e9);
  EXPECT_TRUE(FindSample(m, "process_cpu_seconds_total").has_value());

  held->Release();
  EXPECT_EQ(FindSample(Scrape(port), "knnd_queries_in_flight"), 0);
}

TEST(Metrics, IndexInfoSeriesIsReplacedByTheNextIndex) {
  AdmissionGate gate(AdmissionGate::Options{});
  auto pool = WorkerPool::Create(WorkerPool::Options{1, 1});
  ASSERT_TRUE(pool.ok());
  Metrics::Options options;
  options.listen_address = "127.0.0.1:0";
  auto metrics = Metrics::Create(options, ServingLoad(&gate, pool->get()));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_TRUE((*metrics)->StartExposer().ok());

  IndexInfo info;
  info.path = "/nonexistent/a.index";  // residency series left out
  info.index_type = "IVF16,PQ4";
  info.version = 1;
  info.ntotal = 10;
  (*metrics)->SetIndexInfo(info);
  info.version = 2;
  info.ntotal = 20;
  info.factory = "OPQ4,IVF16,PQ4";
  (*metrics)->SetIndexInfo(info);

  const std::vector<Sample> m = Scrape((*metrics)->port());
  EXPECT_EQ(SumSamples(m, "knnd_index_info"), 1);
  EXPECT_EQ(FindSample(m, "knnd_index_info",
                       {{"version", "2"}, {"factory", "OPQ4,IVF16,PQ4"}}),
            1);
  EXPECT_EQ(FindSample(m, "knnd_index_vectors"), 20);
  EXPECT_FALSE(FindSample(m, "knnd_index_mapped_bytes").has_value());
}

TEST(Metrics, StartExposerFailsOnAPortInUse) {
  AdmissionGate gate(AdmissionGate::Options{});
  auto pool = WorkerPool::Create(WorkerPool::Options{1, 1});
  ASSERT_TRUE(pool.ok());
  Metrics::Options options;
  options.listen_address = "127.0.0.1:0";
  auto first = Metrics::Create(options, ServingLoad(&gate, pool->get()));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->StartExposer().ok());

  options.listen_address = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = Metrics::Create(options, ServingLoad(&gate, pool->get()));
  ASSERT_TRUE(second.ok());
  absl::Status s = (*second)->StartExposer();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(options.listen_address), std::string::npos) << s;
  EXPECT_EQ((*second)->port(), 0);
}

// StopExposer() closes the port (bound to the wildcard address, where it
// wakes civetweb through loopback, or to loopback itself) and joins its
// threads: the port is free for the next exposer at once, and a second
// call or the destructor after it does nothing. How long a stop took is
// printed, not asserted (civetweb alone: up to its 2 s poll quantum).
TEST(Metrics, StopExposerFreesThePortForTheNextOne) {
  AdmissionGate gate(AdmissionGate::Options{});
  auto pool = WorkerPool::Create(WorkerPool::Options{1, 1});
  ASSERT_TRUE(pool.ok());
  for (const std::string host : {"0.0.0.0", "127.0.0.1"}) {
    Metrics::Options options;
    options.listen_address = host + ":0";
    auto first = Metrics::Create(options, ServingLoad(&gate, pool->get()));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->StartExposer().ok());
    const int port = (*first)->port();
    ASSERT_GT(port, 0);
    ASSERT_TRUE(HttpGet(port, "/metrics").ok()) << host;

    const absl::Time start = absl::Now();
    (*first)->StopExposer();
    std::printf("%s: stopped in %.1f ms\n", host.c_str(),
                absl::ToDoubleMilliseconds(absl::Now() - start));
    EXPECT_EQ((*first)->port(), 0) << host;
    EXPECT_FALSE(HttpGet(port, "/metrics").ok()) << host;
    (*first)->StopExposer();

    options.listen_address = absl::StrCat(host, ":", port);
    auto next = Metrics::Create(options, ServingLoad(&gate, pool->get()));
    ASSERT_TRUE(next.ok());
    ASSERT_TRUE((*next)->StartExposer().ok()) << options.listen_address;
    EXPECT_EQ((*next)->port(), port) << host;
    EXPECT_TRUE(HttpGet(port, "/metrics").ok()) << host;
  }
}

// The full path of `tool` on PATH, or "" when it is not installed.
std::string Which(const std::string& tool) {
  std::string path;
  if (RunCommand(absl::StrCat("command -v ", tool, " 2>/dev/null"), &path) !=
      0) {
    return "";
  }
  while (!path.empty() && isspace(static_cast<unsigned char>(path.back()))) {
    path.pop_back();
  }
  return path;
}

// An in-process knnd that has answered `searches` single-query searches.
RunningServer ServeAndSearch(const TempDir& tmp, int searches) {
  const IndexSpec spec;
  WriteIndex(tmp.path("p.index"), spec);
  RunningServer s = StartServer(TestConfig(tmp.path("p.index")));
  for (int i = 0; i < searches && s.stub != nullptr; ++i) {
    grpc::Status status = CallSearch(
        *s.stub, MakeSearchRequest(MakeData(1, spec.d, 100 + i), 10));
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  return s;
}

TEST(MetricsExposition, PassesPromtoolCheckMetrics) {
  const std::string promtool = Which("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not installed: apt-get install prometheus "
                    "(make deps does)";
  }
  TempDir tmp;
  RunningServer s = ServeAndSearch(tmp, 3);
  ASSERT_NE(s.stub, nullptr);
  absl::StatusOr<std::string> scrape =
      HttpGet(s.server->metrics_port(), "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  const std::string file = tmp.path("scrape.txt");
  std::ofstream(file) << *scrape;

  std::string output;
  const int rc =
      RunCommand(absl::StrCat(promtool, " check metrics < ", file, " 2>&1"),
                 &output);
  // promtool exits 0 with warnings printed; any output is a lint finding.
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << "promtool check metrics:\n" << output;
}

// A Prometheus server on loopback, stopped (SIGTERM) on destruction.
class PrometheusServer {
 public:
  PrometheusServer(const std::string& binary, const TempDir& tmp,
                   int scrape_port) {
    port_ = FreePort();
    const std::string config = tmp.path("prometheus.yml");
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n"
                          << "scrape_configs:\n  - job_name: knnd\n"
                          << "    static_configs:\n"
                          << "      - targets: ['127.0.0.1:" << scrape_port
                          << "']\n";
    const std::string log = tmp.path("prometheus.log");
    const std::string args[] = {
        binary,
        "--config.file=" + config,
        "--storage.tsdb.path=" + tmp.path("tsdb"),
        absl::StrCat("--web.listen-address=127.0.0.1:", port_),
        "--log.level=warn"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    if (log_fd >= 0) close(log_fd);
  }
  ~PrometheusServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

  // The single value of an instant query, or nullopt while it has none.
  absl::optional<double> Query(const std::string& promql) const {
    absl::StatusOr<std::string> body =
        HttpGet(port_, "/api/v1/query?query=" + UrlEncode(promql));
    if (!body.ok()) return absl::nullopt;
    static const std::regex kValue(R"re("value":\[[0-9.e+]+,"([^"]+)"\])re");
    std::vector<double> values;
    for (auto it = std::sregex_iterator(body->begin(), body->end(), kValue);
         it != std::sregex_iterator(); ++it) {
      values.push_back(std::stod((*it)[1]));
    }
    if (values.size() != 1) return absl::nullopt;
    return values[0];
  }

  // Polls `promql` until it equals `want` or 30 s pass; the last value.
  absl::optional<double> WaitFor(const std::string& promql, double want) const {
    absl::optional<double> v;
    for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(250))) {
      v = Query(promql);
      if (v == want) break;
    }
    return v;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(PrometheusEndToEnd, ScrapedSeriesMatchTheTrafficSent) {
  const std::string prometheus = Which("prometheus");
  if (prometheus.empty()) {
    GTEST_SKIP() << "prometheus not installed: apt-get install prometheus "
                    "(make deps does)";
  }
  constexpr int kSearches = 12;
  TempDir tmp;
  RunningServer s = ServeAndSearch(tmp, kSearches);
  ASSERT_NE(s.stub, nullptr);
  PrometheusServer server(prometheus, tmp, s.server->metrics_port());

  const std::string ok =
      R"(grpc_server_handled_total{job="knnd",grpc_method="Search",grpc_code="OK",protocol="grpc"})";
  EXPECT_EQ(server.WaitFor(ok, kSearches), kSearches)
      << "Prometheus log: " << tmp.path("prometheus.log");
  EXPECT_EQ(
      server.Query(
          R"(grpc_server_handling_seconds_count{grpc_method="Search",protocol="grpc"})"),
      kSearches);
  EXPECT_EQ(
      server.Query(
          R"(grpc_server_handling_seconds_bucket{grpc_method="Search",protocol="grpc",le="+Inf"})"),
      kSearches);
  EXPECT_EQ(server.Query("up{job=\"knnd\"}"), 1);
  EXPECT_GT(server.Query("process_resident_memory_bytes").value_or(0), 0);
  EXPECT_GT(server.Query(R"(knnd_process_resident_memory_bytes{type="anonymous"})")
                .value_or(0),
            0);
  EXPECT_GT(server.Query(R"(knnd_process_resident_memory_bytes{type="file"})")
                .value_or(0),
            0);
  // The split covers the whole RSS (same scrape, same instant).
  const absl::optional<double> share = server.Query(
      "sum(knnd_process_resident_memory_bytes) / sum(process_resident_memory_bytes)");
  ASSERT_TRUE(share.has_value());
  EXPECT_NEAR(*share, 1.0, 0.05);
}

}  // namespace
}  // namespace knnd
