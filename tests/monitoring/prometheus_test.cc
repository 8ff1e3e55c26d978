// knnd's /metrics against the real Prometheus tools from the Debian package
// `prometheus`: `promtool check metrics` on a live scrape, and a Prometheus
// server scraping an in-process knnd, read back through its query API.
// Without the package (make deps installs it) the tests are skipped with a
// message saying so.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FreePort;
using ::knnd::testing::HttpGet;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::RunningServer;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::UrlEncode;
using ::knnd::testing::WriteIndex;

// The full path of `tool` on PATH, or "" when it is not installed.
std::string Which(const std::string& tool) {
  FILE* p = popen(absl::StrCat("command -v ", tool, " 2>/dev/null").c_str(), "r");
  char line[4096] = {0};
  const bool found = fgets(line, sizeof line, p) != nullptr;
  pclose(p);
  std::string path = found ? line : "";
  while (!path.empty() && isspace(static_cast<unsigned char>(path.back()))) {
    path.pop_back();
  }
  return path;
}

// Runs a shell command; its exit status and combined output.
int RunShell(const std::string& command, std::string* output) {
  FILE* p = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// An in-process knnd that has answered `searches` single-query searches.
RunningServer ServeAndSearch(const TempDir& tmp, int searches) {
  const IndexSpec spec;
  WriteIndex(tmp.path("p.index"), spec);
  RunningServer s = StartServer(TestConfig(tmp.path("p.index")));
  for (int i = 0; i < searches && s.stub != nullptr; ++i) {
    const std::vector<float> q = MakeData(1, spec.d, 100 + i);
    knnd::v1::SearchRequest request;
    *request.mutable_vectors() = {q.begin(), q.end()};
    request.set_k(10);
    knnd::v1::SearchResponse response;
    grpc::ClientContext context;
    grpc::Status status = s.stub->Search(&context, request, &response);
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
      RunShell(absl::StrCat(promtool, " check metrics < ", file), &output);
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
      R"(grpc_server_handled_total{job="knnd",grpc_method="Search",grpc_code="OK"})";
  EXPECT_EQ(server.WaitFor(ok, kSearches), kSearches)
      << "Prometheus log: " << tmp.path("prometheus.log");
  EXPECT_EQ(server.Query(R"(grpc_server_handling_seconds_count{grpc_method="Search"})"),
            kSearches);
  EXPECT_EQ(server.Query(R"(grpc_server_handling_seconds_bucket{grpc_method="Search",le="+Inf"})"),
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
